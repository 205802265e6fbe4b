"""Chunks of 500-1,000 characters at sentence boundaries; whole-document splits."""

import itertools

import pytest

from caliber_jax.data import corpus
from caliber_jax.mining import chunking

SENTENCES = [
    f"Sentence number {i} says revenue was ${i},000 in 2019 {'and more ' * (i % 9)}."
    for i in range(80)
]


def test_chunks_respect_bounds_and_sentence_ends():
    text = " ".join(SENTENCES)
    chunks = chunking.chunk_text(text, min_chars=500, max_chars=1000)
    assert len(chunks) > 3
    for chunk in chunks[:-1]:
        assert 500 <= len(chunk) <= 1000
        assert chunk.endswith(".")  # every sentence here is < 500 chars: no cut inside one
    assert len(chunks[-1]) <= 1000
    # Nothing lost, nothing repeated: the chunks are the text, re-joined at single spaces.
    assert " ".join(chunks) == " ".join(text.split())
    # Each chunk starts a sentence.
    assert all(chunk.startswith("Sentence number") for chunk in chunks)


def test_long_sentence_is_cut_at_spaces_and_short_tail_joins():
    long_sentence = "word " * 400  # 2,000 characters, no sentence end
    chunks = chunking.chunk_text(long_sentence.strip() + ".", min_chars=500, max_chars=1000)
    assert [len(c) <= 1000 for c in chunks] == [True] * len(chunks)
    assert " ".join(chunks) == (long_sentence.strip() + ".")
    tail = chunking.chunk_text("A" * 600 + ". Short end.", min_chars=500, max_chars=1000)
    assert tail == ["A" * 600 + ". Short end."]


def test_short_chunk_is_filled_up_inside_the_next_sentence():
    """A 300-char chunk followed by a 900-char sentence: the sentence is split to fill to
    at most 1000 rather than emitting a chunk below 500."""
    first = "Alpha " * 49 + "end."
    second = "Beta " * 179 + "end."
    chunks = chunking.chunk_text(first + " " + second, min_chars=500, max_chars=1000)
    assert len(chunks[0]) >= 500 and len(chunks[0]) <= 1000
    assert " ".join(chunks) == first + " " + second


def test_real_filing_chunks_and_document_split():
    records = list(itertools.islice(corpus.load_records("data/sample/filings.jsonl.gz"), 3))
    chunks = list(
        chunking.make_chunks(
            records, min_chars=500, max_chars=1000, val_fraction=0.34, test_fraction=0.33, seed=16
        )
    )
    by_doc = {}
    for chunk in chunks:
        by_doc.setdefault(chunk["doc_name"], []).append(chunk)
    assert len(by_doc) == 3
    assert {docs[0]["split"] for docs in by_doc.values()} == {"train", "val", "test"}
    for doc_chunks in by_doc.values():
        assert len({c["split"] for c in doc_chunks}) == 1  # whole documents
        lengths = [len(c["text"]) for c in doc_chunks]
        assert max(lengths) <= 1000
        assert sum(length >= 500 for length in lengths[:-1]) / (len(lengths) - 1) > 0.99
        assert [c["index"] for c in doc_chunks] == list(range(len(doc_chunks)))
    # Splits depend on the set of documents, not their order, and keep the proportions.
    names = [r["doc_name"] for r in records]
    splits = chunking.assign_splits(names[::-1], val_fraction=0.34, test_fraction=0.33, seed=16)
    assert splits == {name: docs[0]["split"] for name, docs in by_doc.items()}
    many = chunking.assign_splits(
        [f"d{i}" for i in range(10)], val_fraction=0.2, test_fraction=0.2, seed=0
    )
    assert sorted(many.values()).count("test") == 2 and list(many.values()).count("val") == 2
    eval_record = {**records[0], "doc_name": "X", "financebench_eval_doc": True}
    eval_chunks = list(
        chunking.make_chunks(
            [eval_record],
            min_chars=500,
            max_chars=1000,
            val_fraction=0.2,
            test_fraction=0.2,
            seed=0,
        )
    )
    assert {c["split"] for c in eval_chunks} == {"eval"}


@pytest.mark.parametrize("flag, split", [(1, "eval"), ("True", "eval"), ("1", "eval"),
                                         (0, None), ("False", None), ("no", None)])  # fmt: skip
def test_the_eval_flag_is_read_as_prepare_reads_it(flag, split):
    """Mining and prepare read `financebench_eval_doc` alike (`corpus.is_eval_doc`): an export
    writing 1 keeps the filing out of mining's training splits as it keeps it out of prepare's."""
    text = "\n\n".join(f"Paragraph {i}. " + "Revenue was $5.2 million in 2020. " * 20
                       for i in range(4))  # fmt: skip
    record = {"doc_name": "X", "text": text, "financebench_eval_doc": flag}
    chunks = list(chunking.make_chunks([record], min_chars=500, max_chars=1000,
                                       val_fraction=0.0, test_fraction=0.0, seed=0))  # fmt: skip
    assert chunks and {c["split"] for c in chunks} == {split or "train"}
    passages = list(corpus.make_passages([record], min_chars=200, max_chars=1200))
    assert bool(passages) is (split is None)
