"""Chunks of 500-1,000 characters at sentence boundaries; whole-document splits (paper 001 IV-A).

Chunk records are `{"id": "<doc_name>:<index>", "doc_name", "index", "text", "split"}`; every
chunk of a document shares its document's split ("train", "val", "test" or "eval" for FinanceBench
evaluation filings, which never enter mining). No jax.
"""

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from caliber_jax.data import corpus

SPLITS = ("train", "val", "test")
EVAL_SPLIT = "eval"


def _split_at_spaces(text: str, max_chars: int) -> list[str]:
    """Pieces of at most `max_chars` cut at the last space before the limit (a hard cut if none)."""
    pieces = []
    while len(text) > max_chars:
        cut = text.rfind(" ", 0, max_chars + 1)
        cut = cut if cut > 0 else max_chars
        pieces.append(text[:cut].strip())
        text = text[cut:].strip()
    if text:
        pieces.append(text)
    return pieces


def sentence_pieces(text: str, max_chars: int) -> list[str]:
    """Sentences of cleaned `text` (paragraph by paragraph), each at most `max_chars` long.

    A sentence longer than `max_chars` is cut at whitespace: the only place a chunk boundary
    falls inside a sentence.
    """
    pieces = []
    for paragraph in text.split("\n\n"):
        paragraph = " ".join(paragraph.split())
        for sentence in corpus.split_sentences(paragraph):
            pieces += _split_at_spaces(sentence.strip(), max_chars)
    return [piece for piece in pieces if piece]


def chunk_text(text: str, *, min_chars: int, max_chars: int) -> list[str]:
    """Greedy packing of whole sentences into chunks of `min_chars`..`max_chars` characters.

    A chunk closes when the next sentence would push it past `max_chars`. If it is still shorter
    than `min_chars` then, the next sentence is split at whitespace to fill it up to `max_chars`
    (sentence boundaries are respected "where possible", as the paper puts it). Only the last
    chunk of a text may be shorter than `min_chars`; it joins the previous chunk when both fit
    in `max_chars`.
    """
    if not 0 < min_chars <= max_chars:
        raise ValueError(f"need 0 < min_chars <= max_chars, got {min_chars=} {max_chars=}")
    chunks: list[str] = []
    current = ""
    for piece in sentence_pieces(text, max_chars):
        joined = f"{current} {piece}" if current else piece
        if len(joined) <= max_chars:
            current = joined
            continue
        if len(current) < min_chars:
            room = max_chars - len(current) - 1
            cut = piece.rfind(" ", 0, room + 1)
            if cut > 0:
                current = f"{current} {piece[:cut]}"
                piece = piece[cut + 1 :]
        chunks.append(current)
        current = piece
    if current:
        if len(current) < min_chars and chunks and len(chunks[-1]) + 1 + len(current) <= max_chars:
            chunks[-1] = f"{chunks[-1]} {current}"
        else:
            chunks.append(current)
    return chunks


def assign_splits(
    doc_names: Sequence[str], *, val_fraction: float, test_fraction: float, seed: int
) -> dict[str, str]:
    """Whole documents to "train" / "val" / "test", in the given proportions.

    Documents are ordered by a hash of (seed, doc_name); the first round(test_fraction * n) are
    "test", the next round(val_fraction * n) "val", the rest "train". Proportions hold even for a
    handful of documents (a per-document coin would often leave a split empty), and the split of
    a document depends only on the seed and the set of documents, never on their order.
    """
    if val_fraction < 0 or test_fraction < 0 or val_fraction + test_fraction >= 1:
        raise ValueError(
            f"need fractions >= 0 summing below 1, got {val_fraction=} {test_fraction=}"
        )
    names = sorted(set(doc_names), key=lambda name: (_hash(seed, name), name))
    num_test = round(test_fraction * len(names))
    num_val = round(val_fraction * len(names))
    return {
        name: "test" if row < num_test else "val" if row < num_test + num_val else "train"
        for row, name in enumerate(names)
    }


def _hash(seed: int, doc_name: str) -> bytes:
    return hashlib.sha256(f"{seed}:{doc_name}".encode()).digest()


def make_chunks(
    records: Iterable[Mapping[str, Any]],
    *,
    min_chars: int,
    max_chars: int,
    val_fraction: float,
    test_fraction: float,
    seed: int,
    eval_docs_split: bool = True,
) -> Iterator[dict[str, Any]]:
    """Cleans and chunks each document record; yields chunk records with their document's split.

    Args:
      records: dicts with `doc_name` and `text` (as `corpus.load_records` yields them).
      min_chars, max_chars: chunk length bounds (`chunk_text`).
      val_fraction, test_fraction: shares of documents held out (`assign_splits`).
      seed: split seed.
      eval_docs_split: put FinanceBench evaluation filings (`corpus.is_eval_doc`) in the
        "eval" split, outside train/val/test, so mining never trains on them.
    """
    records = list(records)
    names = [str(record["doc_name"]) for record in records]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"duplicate doc_name {duplicates[0]!r}; chunk ids would collide")
    is_eval = [eval_docs_split and corpus.is_eval_doc(record) for record in records]
    splits = assign_splits(
        [n for n, e in zip(names, is_eval, strict=True) if not e],
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        seed=seed,
    )
    for record, doc_name, evaluation in zip(records, names, is_eval, strict=True):
        split = EVAL_SPLIT if evaluation else splits[doc_name]
        texts = chunk_text(
            corpus.clean_text(record["text"]), min_chars=min_chars, max_chars=max_chars
        )
        for index, text in enumerate(texts):
            yield {
                "id": f"{doc_name}:{index}",
                "doc_name": doc_name,
                "index": index,
                "text": text,
                "split": split,
            }
