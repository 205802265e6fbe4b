"""Tests for caliber_jax.data.corpus: reading, cleaning, passage cutting, dedup, atomic writes."""

import gzip
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from caliber_jax.data import corpus
from tests.conftest import SAMPLE_FILINGS as FILINGS

SENTENCE = "Revenue was $5.2 million in 2020, up 3% from the prior year."


def write_lines(path: Path, lines: list[bytes]) -> Path:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wb") as stream:
        stream.write(b"\n".join(lines) + b"\n")
    return path


# --- reading -------------------------------------------------------------------------------------


def test_load_jsonl_keeps_metadata(tmp_path):
    path = write_lines(
        tmp_path / "c.jsonl",
        [
            json.dumps({"doc_name": "a", "text": "alpha", "company": "X"}).encode(),
            b"",
            json.dumps({"body": "no name", "year": 2020, "text": "beta"}).encode(),
        ],
    )
    records = list(corpus.load_records(path))
    assert records == [
        {"text": "alpha", "doc_name": "a", "company": "X"},
        {"text": "beta", "body": "no name", "year": 2020, "doc_name": "c.jsonl:3"},
    ]


def test_load_jsonl_gz_with_custom_text_field(tmp_path):
    path = write_lines(
        tmp_path / "c.jsonl.gz",
        [json.dumps({"doc_name": "a", "body": "\u20ac5 \u2212 x"}).encode()],
    )
    assert list(corpus.load_records(path, text_field="body")) == [
        {"text": "\u20ac5 \u2212 x", "doc_name": "a"}
    ]


def test_load_txt_is_one_document(tmp_path):
    path = tmp_path / "report.txt"
    path.write_text("line one\nline two\n", encoding="utf-8")
    assert list(corpus.load_records(path)) == [
        {"text": "line one\nline two\n", "doc_name": "report"}
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"text": "ok", ', "malformed JSON"),
        (b'["text"]', "expected a JSON object, got list"),
        (b'{"body": "x"}', "missing text field 'text'"),
        (b'{"text": 5}', "text field 'text' is int, not a string"),
        (b'{"text": "caf\xe9"}', "invalid UTF-8"),
        (b'{"text": "x", "doc_name": null}', "doc_name is null; expected a non-empty string"),
        (b'{"text": "x", "doc_name": ""}', 'doc_name is ""; expected'),
        (b'{"text": "x", "doc_name": true}', "doc_name is true; expected"),
        (b'{"text": "x", "doc_name": ["a"]}', r'doc_name is \["a"\]; expected'),
    ],
)
@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_load_jsonl_errors_name_file_and_line(tmp_path, line, message, suffix):
    path = write_lines(tmp_path / f"bad{suffix}", [b'{"text": "fine"}', b"", line])
    with pytest.raises(ValueError, match=rf"^{path}:3: {message}"):
        list(corpus.load_records(path))


def test_load_refuses_a_repeated_doc_name_naming_both_lines(tmp_path):
    lines = [
        b'{"text": "x", "doc_name": "10K"}',
        b'{"text": "y"}',
        b'{"text": "z", "doc_name": "10K"}',
    ]
    path = write_lines(tmp_path / "f.jsonl", lines)
    with pytest.raises(ValueError, match=rf"^{path}:3: doc_name '10K' is line 1's too"):
        list(corpus.load_records(path))
    # A stand-in name ("<file>:<line>") taken by another record's own name also collides.
    path = write_lines(
        tmp_path / "g.jsonl", [b'{"text": "x", "doc_name": "g.jsonl:2"}', b'{"text": "y"}']
    )
    with pytest.raises(ValueError, match=rf"^{path}:2: doc_name 'g.jsonl:2' is line 1's too"):
        list(corpus.load_records(path))


def test_load_txt_bad_utf8_names_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"good\nalso good\nbad \xff byte\n")
    with pytest.raises(ValueError, match=rf"^{path}:3: invalid UTF-8"):
        list(corpus.load_records(path))


def test_load_rejects_unknown_suffix(tmp_path):
    with pytest.raises(ValueError, match="unsupported corpus file"):
        list(corpus.load_records(tmp_path / "x.csv"))


# --- cleaning ------------------------------------------------------------------------------------


def test_clean_text_removes_pdf_debris_and_keeps_sentences():
    raw = (
        "Table of Contents\n"
        f"{SENTENCE}\n"
        "55\n"
        "\f"
        "Page 3 of 40\n"
        "Net sales $ 32,184 $ 32,136 $ 32,765\n"
        "2,919 $\n"
        "(2,887)\n"
        "..........................\n"
        "- - - - - - - -\n"
        "Liquidity.\u00a0Cash rose 4% in 2021.\n\n\n\n"
        "Results by segment:\n"
    )
    assert corpus.clean_text(raw) == (
        f"{SENTENCE}\n\nLiquidity. Cash rose 4% in 2021.\n\nResults by segment:"
    )


def test_clean_text_joins_line_end_hyphens():
    assert corpus.clean_text("a long-\nterm loan and an inter\u00ad\nnational one") == (
        "a long-term loan and an international one"
    )


def test_clean_text_breaks_paragraphs_after_short_lines():
    wide = "X" * 60
    raw = f"Heading\n{wide} continues\nthe sentence. Done.\nNext paragraph starts {wide}"
    assert corpus.clean_text(raw) == (
        f"Heading\n\n{wide} continues\nthe sentence. Done.\n\nNext paragraph starts {wide}"
    )


# --- cutting -------------------------------------------------------------------------------------


def sentences(count: int, words: int = 12) -> list[str]:
    return [
        " ".join(f"w{index}x{word}" for word in range(words)).capitalize() + "."
        for index in range(count)
    ]


def test_cut_merges_short_paragraphs():
    paragraphs = [f"Paragraph {index} says {SENTENCE}" for index in range(6)]  # ~80 chars each
    passages = corpus.cut_passages("\n\n".join(paragraphs), min_chars=200, max_chars=1200)
    assert passages == ["\n".join(paragraphs[:3]), "\n".join(paragraphs[3:])]


def test_cut_splits_long_paragraphs_at_sentence_ends():
    hundred = [f"Sentence {index:02d} " + "a" * 87 + "." for index in range(30)]
    assert {len(sentence) for sentence in hundred} == {100}
    paragraph = " ".join(hundred)  # 3,029 characters, one paragraph.
    passages = corpus.cut_passages(paragraph, min_chars=200, max_chars=1200)
    # Greedy packing: 11 sentences (1,110 chars) fit in 1,200, a 12th does not.
    assert passages == [" ".join(hundred[:11]), " ".join(hundred[11:22]), " ".join(hundred[22:])]


def test_cut_does_not_split_abbreviations():
    text = "Sales in the U.S. Midwest grew. " * 60
    for passage in corpus.cut_passages(text, min_chars=100, max_chars=400):
        assert passage.endswith("grew.") and passage.startswith("Sales in the U.S. Midwest")


def test_cut_hard_splits_at_whitespace_without_sentence_ends():
    text = " ".join(f"word{index}" for index in range(400))  # 3,089 chars, no terminator.
    passages = corpus.cut_passages(text, min_chars=200, max_chars=1000)
    assert len(passages) == 4  # Near-equal pieces (~772 chars), so no short tail is lost.
    assert all(760 <= len(passage) <= 780 for passage in passages)
    assert " ".join(passages) == text  # Every cut fell on a space.


def test_cut_attaches_short_tail_and_drops_lone_fragments():
    body = " ".join(sentences(8))  # ~900 chars
    assert corpus.cut_passages(f"{body}\n\nThe end.", min_chars=200, max_chars=1200) == [
        f"{body}\nThe end."
    ]
    assert corpus.cut_passages("Too short.", min_chars=200, max_chars=1200) == []


def test_cut_rejects_bad_bounds():
    with pytest.raises(ValueError, match="min_chars <= max_chars"):
        corpus.cut_passages("x", min_chars=500, max_chars=100)


words = st.text(alphabet="abcdefgh", min_size=1, max_size=12)
sentence = st.lists(words, min_size=1, max_size=30).map(lambda ws: " ".join(ws).capitalize() + ".")
paragraph = st.lists(sentence, min_size=1, max_size=20).map(" ".join)
document = st.lists(paragraph, min_size=1, max_size=8).map("\n\n".join)


@settings(max_examples=200, deadline=None)
@given(document, st.integers(20, 300), st.integers(0, 600))
def test_cut_properties(text, min_chars, extra):
    max_chars = min_chars + extra
    passages = corpus.cut_passages(text, min_chars=min_chars, max_chars=max_chars)
    source_words = text.split()
    position = 0
    for passage in passages:
        assert min_chars <= len(passage) <= max_chars
        passage_words = passage.split()
        # Whole words only, in order, none skipped inside a passage.
        starts = [
            start
            for start in range(position, len(source_words))
            if source_words[start : start + len(passage_words)] == passage_words
        ]
        assert starts, passage
        position = starts[0] + len(passage_words)


# --- passages ------------------------------------------------------------------------------------


def test_make_passages_dedups_excludes_eval_docs_and_keeps_metadata():
    shared = f"Shared boilerplate. {SENTENCE} " * 4
    unique = f"Only in b. {SENTENCE} " * 4
    records = [
        {"doc_name": "a", "text": shared, "company": "A", "financebench_eval_doc": False},
        {"doc_name": "b", "text": f"{shared}\n\n{unique}", "company": "B"},
        {"doc_name": "c", "text": unique + " Extra.", "financebench_eval_doc": True},
    ]
    passages = list(corpus.make_passages(records, min_chars=100, max_chars=1200))
    assert [(passage["id"], passage["company"]) for passage in passages] == [
        ("a:0", "A"),
        ("b:1", "B"),
    ]
    assert passages[0] == {
        "id": "a:0",
        "text": shared.strip(),
        "doc_name": "a",
        "company": "A",
        "financebench_eval_doc": False,
    }
    assert passages[1]["text"] == unique.strip()
    with_eval = list(
        corpus.make_passages(records, min_chars=100, max_chars=1200, exclude_eval_docs=False)
    )
    assert [passage["id"] for passage in with_eval] == ["a:0", "b:1", "c:0"]


def test_record_fields_never_replace_the_passage_fields(tmp_path):
    """A record's own "id" (common in JSONL corpora) or "text" beside another text field does not
    overwrite the passage's: every passage keeps its id, the chosen field's text stays."""
    path = write_lines(tmp_path / "c.jsonl", [json.dumps(
        {"doc_name": "a", "id": "doc-7", "text": "Cover page",
         "content": " ".join(f"Item {i}. {SENTENCE}" for i in range(30))}
    ).encode()])  # fmt: skip
    (record,) = corpus.load_records(path, text_field="content")
    assert record["text"].startswith("Item 0.")
    passages = list(corpus.make_passages([record], min_chars=100, max_chars=300))
    ids = [passage["id"] for passage in passages]
    assert len(ids) > 1 and len(set(ids)) == len(ids)
    assert all(id_.startswith("a:") for id_ in ids)


@pytest.mark.parametrize(
    "value, expected",
    [(True, True), (1, True), ("true", True), ("True", True), (" YES ", True), ("1", True),
     (False, False), (0, False), ("false", False), ("False", False), ("no", False), ("0", False),
     ("", False), (None, False)],
)  # fmt: skip
def test_is_eval_doc_reads_every_spelling_one_way(value, expected):
    """prepare and mining read the FinanceBench flag alike: an export writing 1 or "False" neither
    leaks an evaluation filing into training nor drops a training one."""
    assert corpus.is_eval_doc({"doc_name": "d", corpus.EVAL_DOC_FIELD: value}) is expected
    assert corpus.is_eval_doc({"doc_name": "d"}) is False
    records = [{"doc_name": "d", "text": f"{SENTENCE} " * 4, corpus.EVAL_DOC_FIELD: value}]
    assert bool(list(corpus.make_passages(records, min_chars=100))) is not expected


@pytest.mark.parametrize("value", ["maybe", 2, 0.5, [True]])
def test_is_eval_doc_rejects_other_values_naming_the_document(value):
    with pytest.raises(ValueError, match="document 'd': financebench_eval_doc="):
        corpus.is_eval_doc({"doc_name": "d", corpus.EVAL_DOC_FIELD: value})


def test_make_passages_rejects_duplicate_doc_names():
    records = [{"doc_name": "a", "text": SENTENCE}, {"doc_name": "a", "text": SENTENCE}]
    with pytest.raises(ValueError, match="duplicate doc_name 'a'"):
        list(corpus.make_passages(records))


def test_real_filing_passages():
    with gzip.open(FILINGS, "rt", encoding="utf-8") as stream:
        record = json.loads(stream.readline())
    passages = list(corpus.make_passages([record]))
    assert len(passages) > 500
    assert {passage["doc_name"] for passage in passages} == {record["doc_name"]}
    for passage in passages:
        assert 200 <= len(passage["text"]) <= 1200
        assert "\f" not in passage["text"] and "Table of Contents" not in passage["text"]


# --- writing -------------------------------------------------------------------------------------


def test_save_jsonl_round_trip_and_atomic_failure(tmp_path):
    path = tmp_path / "out" / "rows.jsonl"
    rows = [{"id": "a", "text": "\u20ac1"}, {"id": "b", "value": None}]
    assert corpus.save_jsonl(path, rows) == 2
    assert corpus.load_jsonl(path) == rows

    def failing():
        yield {"id": "c"}
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        corpus.save_jsonl(path, failing())
    assert corpus.load_jsonl(path) == rows  # The old file survives intact.
    assert os.listdir(path.parent) == ["rows.jsonl"]  # No temporary left behind.


def test_save_jsonl_gz(tmp_path):
    rows = [{"id": "a", "text": "\u00a31.5 billion"}]
    corpus.save_jsonl(tmp_path / "rows.jsonl.gz", rows)
    with gzip.open(tmp_path / "rows.jsonl.gz", "rt", encoding="utf-8") as stream:
        assert [json.loads(line) for line in stream] == rows
    assert list(corpus.load_records(tmp_path / "rows.jsonl.gz")) == [
        {"text": "\u00a31.5 billion", "id": "a", "doc_name": "rows.jsonl.gz:1"}
    ]


def test_save_json(tmp_path):
    corpus.save_json(tmp_path / "stats.json", {"b": 1, "a": [1, 2]})
    assert json.loads((tmp_path / "stats.json").read_text()) == {"a": [1, 2], "b": 1}


def test_a_truncated_or_mislabelled_gzip_is_one_line_naming_the_file(tmp_path):
    rows = [json.dumps({"doc_name": f"d{i}", "text": "Revenue rose 5%." * 50}) for i in range(50)]
    whole = gzip.compress(("\n".join(rows) + "\n").encode())
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"cut.jsonl.gz: not a whole gzip file \(.*lines read\)"):
        list(corpus.load_records(truncated))
    plain = tmp_path / "plain.jsonl.gz"
    plain.write_text("\n".join(rows) + "\n")
    with pytest.raises(ValueError, match=r"plain.jsonl.gz: not a whole gzip file \(Not a gzip"):
        list(corpus.load_records(plain))
    # every other JSONL reader (FinanceBench, NumGap, results) goes through iter_jsonl
    with pytest.raises(ValueError, match=r"cut.jsonl.gz: not a whole gzip file"):
        list(corpus.iter_jsonl(truncated))


def test_a_utf8_byte_order_mark_is_not_text(tmp_path):
    """Windows tools write a byte order mark first: it was the first passage's first character
    (.txt) or a malformed first line (.jsonl)."""
    txt = tmp_path / "report.txt"
    txt.write_bytes(b"\xef\xbb\xbfRevenue rose.\n")
    assert next(corpus.load_records(txt))["text"] == "Revenue rose.\n"
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_bytes(b"\xef\xbb\xbf" + json.dumps({"doc_name": "a", "text": "x"}).encode() + b"\n")
    assert list(corpus.load_records(jsonl)) == [{"text": "x", "doc_name": "a"}]


def test_an_escaped_lone_surrogate_is_one_line_and_a_pair_is_text(tmp_path):
    """JSON lets "\\ud800" stand alone; the string it parses into broke the tokenizer (a
    TypeError traceback in evaluate); a whole pair ("\\ud83d\\ude00") is an emoji, kept."""
    path = tmp_path / "q.jsonl"
    path.write_text('{"doc_name": "a", "text": "up \\ud83d\\ude00"}\n'
                    '{"doc_name": "b", "text": "bad \\ud800 x"}\n')  # fmt: skip
    for read in (corpus.iter_jsonl, corpus.load_records):
        with pytest.raises(ValueError, match=r"q.jsonl:2: an escaped lone surrogate"):
            list(read(path))
    path.write_text('{"doc_name": "a", "text": "up \\ud83d\\ude00"}\n')
    assert next(corpus.load_records(path))["text"] == "up \U0001f600"
