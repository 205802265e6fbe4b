"""Corpus records (.txt, .jsonl, .jsonl.gz), pdftotext clean-up and passage cutting.

Records are dicts with a `text` and a `doc_name` plus whatever metadata the source carries;
passages are dicts `{"id", "text", "doc_name", **metadata}` of at most `max_chars` characters.
"""

import gzip
import hashlib
import io
import json
import math
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from caliber_jax import paths

EVAL_DOC_FIELD = "financebench_eval_doc"
_TRUE_WORDS, _FALSE_WORDS = ("true", "1", "yes"), ("false", "0", "no", "")


def is_eval_doc(record: dict[str, Any]) -> bool:
    """Whether `record` is a FinanceBench evaluation filing (its `financebench_eval_doc`), read
    the same way by prepare and mining: JSON true/false, 1/0, or the strings "true"/"false",
    "1"/"0", "yes"/"no" in any case; missing or null is false. Any other value is an error
    naming the document, so that an export's spelling never lets an evaluation filing train."""
    value = record.get(EVAL_DOC_FIELD)
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS + _FALSE_WORDS:
        return value.strip().lower() in _TRUE_WORDS
    raise ValueError(f"document {record.get('doc_name')!r}: {EVAL_DOC_FIELD}={value!r} is "
                     f"neither true nor false")  # fmt: skip


# Whitespace after ".", "!" or "?" (and closing quotes) that precedes a capital or a digit.
_SENTENCE_END_RE = re.compile(
    r"(?:(?<=[.!?])|(?<=[.!?][\"'\u201d\u2019)\]]))\s+(?=[\"'\u201c\u2018(\[$]?[A-Z0-9])"
)
# A period after these ends an abbreviation, not a sentence ("U.S. Steel", "Apple Inc. The").
_ABBREVIATION_RE = re.compile(
    r"(?:\b(?:[A-Za-z]\.)+|\b(?:Inc|Corp|Co|Ltd|No|Nos|Mr|Mrs|Ms|Dr|Jr|Sr|St|vs|etc|approx|Fig|Sec)\.)$"
)
_PAGE_NUMBER_RE = re.compile(
    r"(?:page\s+)?(?:\d{1,4}|[ivx]{1,5})(?:\s+of\s+\d{1,4})?|table\s+of\s+contents|index",
    re.IGNORECASE,
)
_LEADER_CHARS = frozenset(".-_=\u2014\u2013\u2026\u00b7* ")
_WORD_RE = re.compile(r"[A-Za-z]{2,}")
# A line shorter than this share of its block's widest line ends a paragraph (see clean_text).
SHORT_LINE_FRACTION = 0.7
_STARTS_PARAGRAPH_RE = re.compile("[A-Z0-9\"'(\u201c\u2018\u2022\u25cf\u25aa\u00b7\u2013\u2014-]")


def load_records(path: str | os.PathLike, *, text_field: str = "text") -> Iterator[dict[str, Any]]:
    """Yields the records of a .txt, .jsonl or .jsonl.gz file.

    A .txt file is one record whose `doc_name` is the file stem. A JSONL line is a JSON object
    whose `text_field` (a string) becomes `text`; other fields are kept, and a missing `doc_name`
    becomes "<file name>:<line>". Blank lines are skipped.

    Raises:
      ValueError: "<path>:<line>: ..." for bad UTF-8, malformed JSON, a non-object line, a
        missing / non-string text field, a `doc_name` that is not a non-empty string or an
        integer, or one that an earlier line already used; also for an unknown suffix.
    """
    path = paths.as_path(path)
    name = path.name
    if name.endswith(".txt"):
        data = path.read_bytes()
        yield {"text": _decode(data, path, line_offset=0), "doc_name": path.stem}
    elif name.endswith(".jsonl") or name.endswith(".jsonl.gz"):
        first_line: dict[str, int] = {}
        for number, raw in _numbered_lines(path):
            record = _parse_line(raw, path, number, text_field)
            if record is None:
                continue
            doc_name = str(record["doc_name"])
            if doc_name in first_line:
                earlier = first_line[doc_name]
                raise ValueError(f"{path}:{number}: doc_name {doc_name!r} is line {earlier}'s "
                                 f"too; passage ids would collide")  # fmt: skip
            first_line[doc_name] = number
            yield record
    else:
        raise ValueError(f"{path}: unsupported corpus file; expected .txt, .jsonl or .jsonl.gz")


def _numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw line) of a (.gz) file; a truncated or mislabelled gzip is a
    ValueError naming the file (it was a traceback, or an error without the file's name)."""
    number = 0
    with open_binary(path) as stream:
        try:
            for number, raw in enumerate(stream, start=1):
                yield number, raw
        except (EOFError, gzip.BadGzipFile, zlib.error) as error:
            raise ValueError(f"{path}: not a whole gzip file ({error}; {number} lines "
                             f"read)") from error  # fmt: skip


_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which some Windows tools write first


def _decode(data: bytes, path: Path, line_offset: int) -> str:
    try:
        return data.removeprefix(_BOM if line_offset == 0 else b"").decode("utf-8")
    except UnicodeDecodeError as error:
        line = line_offset + data.count(b"\n", 0, error.start) + 1
        raise ValueError(f"{path}:{line}: invalid UTF-8 at byte {error.start}") from error


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # "\ud800" to "\udfff"


def _check_surrogates(line: str, obj: Any, where: str) -> None:
    """A JSON escape of half a UTF-16 pair ("\\ud800") parses into a string no tokenizer or UTF-8
    writer takes (a TypeError deep in tokenization): ValueError naming `where`. Only lines that
    hold such an escape are checked."""
    if not _SURROGATE_ESCAPE.search(line):
        return
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"{where}: an escaped lone surrogate ({error.object[error.start]!a}) "
                         f"is not text") from None  # fmt: skip


def _check_doc_name(doc_name: Any, where: str) -> None:
    """A document name is a non-empty string or an integer: null, "", true or a list would name
    every passage "None:0", ":0", "True:0" or "[...]:0" (and two nulls would collide)."""
    if isinstance(doc_name, bool) or not isinstance(doc_name, str | int) or doc_name == "":
        raise ValueError(f"{where}: doc_name is {json.dumps(doc_name)}; expected a non-empty "
                         f"string (or leave it out: the file name and line stand in)")  # fmt: skip


def _parse_line(raw: bytes, path: Path, number: int, text_field: str) -> dict[str, Any] | None:
    line = _decode(raw, path, line_offset=number - 1)
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path}:{number}: malformed JSON ({error.msg} at column {error.colno})"
        ) from error
    if not isinstance(obj, dict):
        raise ValueError(f"{path}:{number}: expected a JSON object, got {type(obj).__name__}")
    _check_surrogates(line, obj, f"{path}:{number}")
    if text_field not in obj:
        raise ValueError(f"{path}:{number}: missing text field {text_field!r}")
    text = obj.pop(text_field)
    if not isinstance(text, str):
        raise ValueError(
            f"{path}:{number}: text field {text_field!r} is {type(text).__name__}, not a string"
        )
    obj.setdefault("doc_name", f"{path.name}:{number}")
    _check_doc_name(obj["doc_name"], f"{path}:{number}")
    return {**obj, "text": text}  # `text_field`'s text, whatever else the record calls "text"


def _is_debris(line: str) -> bool:
    """True for page furniture and table remnants: page numbers, leaders, number-only rows."""
    stripped = line.strip()
    if not stripped:
        return False
    if _PAGE_NUMBER_RE.fullmatch(stripped):
        return True
    if not _WORD_RE.search(stripped):
        return True  # No word at all: numbers, symbols, "$", "(2,887) $", "-----".
    if len(stripped) >= 4 and sum(c in _LEADER_CHARS for c in stripped) > 0.5 * len(stripped):
        return True
    tokens = stripped.split()
    wordless = sum(not _WORD_RE.search(token) for token in tokens)
    # Table rows ("Net sales $ 32,184 $ 32,136"): mostly numeric cells and no sentence ending.
    return wordless >= 3 and wordless > len(tokens) / 2 and stripped[-1] not in ".!?:"


def _break_paragraphs(lines: list[str]) -> list[str]:
    """Inserts a blank line after a short line that is followed by a capitalised one.

    pdftotext wraps lines at the page width and rarely leaves blank lines between paragraphs;
    a line much shorter than the widest line of its block ends a paragraph or is a heading.
    """
    output: list[str] = []
    block: list[str] = []
    for line in [*lines, ""]:
        if line.strip():
            block.append(line)
            continue
        width = max((len(text) for text in block), default=0)
        for index, text in enumerate(block):
            output.append(text)
            following = block[index + 1].lstrip() if index + 1 < len(block) else ""
            if (
                following
                and len(text) < SHORT_LINE_FRACTION * width
                and _STARTS_PARAGRAPH_RE.match(following)
            ):
                output.append("")
        output.append(line)
        block = []
    return output[:-1]


def clean_text(text: str) -> str:
    """Removes pdftotext artefacts while keeping every sentence.

    Form feeds become paragraph breaks, non-breaking spaces become spaces, a soft hyphen at a
    line end joins the word and a hyphen at a line end keeps the compound ("long-\\nterm" ->
    "long-term"; filings rarely split words), page-number, leader and numeric table lines go,
    short lines followed by a capitalised line end a paragraph (`_break_paragraphs`), and runs
    of blank lines shrink to one.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\f", "\n\n")
    text = text.replace("\u00a0", " ")
    text = re.sub(r"\u00ad[ \t]*\n[ \t]*", "", text)
    text = re.sub(r"(?<=[A-Za-z])-[ \t]*\n[ \t]*(?=[a-z])", "-", text)
    lines = [line.rstrip() for line in text.split("\n") if not _is_debris(line)]
    text = "\n".join(_break_paragraphs(lines))
    return re.sub(r"\n\s*\n+", "\n\n", text).strip()


def _split_long(sentence: str, max_chars: int) -> list[str]:
    """Splits text longer than `max_chars` into near-equal pieces at whitespace.

    Equal pieces avoid a tiny tail that `cut_passages` would drop. Only a single token longer
    than `max_chars` is cut inside (there is no word boundary to use).
    """
    pieces = []
    while len(sentence) > max_chars:
        count = math.ceil(len(sentence) / max_chars)
        target = math.ceil(len(sentence) / count)
        cut = sentence.rfind(" ", 0, target + 1)
        if cut <= 0:
            cut = sentence.rfind(" ", 0, max_chars + 1)
        if cut <= 0:
            cut = max_chars
        pieces.append(sentence[:cut].strip())
        sentence = sentence[cut:].strip()
    if sentence:
        pieces.append(sentence)
    return pieces


def split_sentences(paragraph: str) -> list[str]:
    """Splits at ".", "!" or "?" (plus closing quotes) followed by space and a capital or digit.

    Periods of abbreviations ("U.S.", "Inc.", "No.") do not end a sentence.
    """
    sentences = []
    start = 0
    for boundary in _SENTENCE_END_RE.finditer(paragraph):
        if _ABBREVIATION_RE.search(paragraph, start, boundary.start()):
            continue
        sentences.append(paragraph[start : boundary.start()])
        start = boundary.end()
    sentences.append(paragraph[start:])
    return [sentence for sentence in sentences if sentence]


def cut_passages(text: str, *, min_chars: int = 200, max_chars: int = 1200) -> list[str]:
    """Cuts cleaned text into passages of at most `max_chars` characters.

    Paragraphs (blank-line separated; inner line breaks become spaces) are packed greedily;
    a new passage starts at a paragraph boundary once the current one has `min_chars`, or when
    the next piece would not fit. Paragraphs longer than `max_chars` are split at sentence ends,
    and sentences longer than that at whitespace. A short tail joins the previous passage when
    it fits; passages still shorter than `min_chars` (headings, stray lines) are dropped.
    """
    if not 0 < min_chars <= max_chars:
        raise ValueError(f"need 0 < min_chars <= max_chars, got {min_chars=} {max_chars=}")
    pieces = []  # (text, starts a paragraph)
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = " ".join(paragraph.split())
        if not paragraph:
            continue
        units = [paragraph] if len(paragraph) <= max_chars else split_sentences(paragraph)
        first = True
        for unit in units:
            for piece in _split_long(unit, max_chars):
                pieces.append((piece, first))
                first = False
    passages: list[str] = []
    current = ""
    for piece, starts_paragraph in pieces:
        separator = "\n" if starts_paragraph else " "
        too_long = len(current) + len(separator) + len(piece) > max_chars
        if current and (too_long or (starts_paragraph and len(current) >= min_chars)):
            passages.append(current)
            current = piece
        else:
            current = current + separator + piece if current else piece
    if current:
        if (
            len(current) < min_chars
            and passages
            and len(passages[-1]) + 1 + len(current) <= max_chars
        ):
            passages[-1] += "\n" + current
        else:
            passages.append(current)
    return [passage for passage in passages if len(passage) >= min_chars]


def make_passages(
    records: Iterable[Mapping[str, Any]],
    *,
    min_chars: int = 200,
    max_chars: int = 1200,
    exclude_eval_docs: bool = True,
) -> Iterator[dict[str, Any]]:
    """Cleans and cuts records into passages, dropping exact duplicates.

    Args:
      records: dicts with `text` and `doc_name` (as from `load_records`).
      min_chars, max_chars: passage length bounds, see `cut_passages`.
      exclude_eval_docs: skip records whose `financebench_eval_doc` is true (`is_eval_doc`), so
        that training never sees FinanceBench evaluation filings.

    Yields:
      {**other record fields, "id": "<doc_name>:<index>", "text", "doc_name"}: the passage's
        own fields over any the record carries under those names.

    Raises:
      ValueError: two records share a `doc_name` (passage ids would collide).
    """
    seen_docs: set[str] = set()
    seen_texts: set[bytes] = set()
    for record in records:
        doc_name = str(record["doc_name"])
        if doc_name in seen_docs:
            raise ValueError(f"duplicate doc_name {doc_name!r}; passage ids would collide")
        seen_docs.add(doc_name)
        if exclude_eval_docs and is_eval_doc(record):
            continue
        metadata = {key: value for key, value in record.items() if key not in ("text", "doc_name")}
        texts = cut_passages(clean_text(record["text"]), min_chars=min_chars, max_chars=max_chars)
        for index, text in enumerate(texts):
            digest = hashlib.sha1(text.encode("utf-8")).digest()
            if digest in seen_texts:
                continue
            seen_texts.add(digest)
            # The passage's own fields win over the record's (an input "id" is the document's).
            yield {**metadata, "id": f"{doc_name}:{index}", "text": text, "doc_name": doc_name}


def _save_atomic(path: str | os.PathLike, write_fn) -> None:
    """Writes `path` whole or not at all: a local file through a temporary file in the same folder
    renamed over it; a remote one (`gs://...`) as one object upload, which object stores publish
    only once complete.

    A path ending in ".gz" is gzip-compressed. A local file gets the umask's permissions
    (`paths.write_atomic`).
    """
    path = paths.as_path(path)
    if paths.is_remote(path):
        buffer = io.BytesIO()
        _write_text(buffer, path.name, write_fn)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(buffer.getvalue())
        return

    def write_local(tmp: Path) -> None:
        with open(tmp, "xb") as raw:
            _write_text(raw, path.name, write_fn)

    paths.write_atomic(os.fspath(path), write_local)


def _write_text(raw, name: str, write_fn) -> None:
    """`write_fn(text stream)` into the binary stream `raw`, gzipped when `name` ends in .gz."""
    if name.endswith(".gz"):
        with gzip.open(raw, "wt", encoding="utf-8") as stream:
            write_fn(stream)
    else:
        stream = io.TextIOWrapper(raw, encoding="utf-8")
        write_fn(stream)
        stream.flush()
        stream.detach()  # leave `raw` open for the caller (BytesIO is read after this)


def open_binary(path: str | os.PathLike):
    """`path` (local, `file://` or a remote URL) opened for reading bytes, gunzipped for ".gz"."""
    path = paths.as_path(path)
    raw = path.open("rb")
    return gzip.GzipFile(fileobj=raw, mode="rb") if path.name.endswith(".gz") else raw


def save_jsonl(path: str | os.PathLike, records: Iterable[Mapping[str, Any]]) -> int:
    """Atomically writes one JSON object per line (gzipped for ".gz"); returns the count."""
    count = 0

    def write(stream):
        nonlocal count
        for record in records:
            stream.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1

    _save_atomic(path, write)
    return count


def save_json(path: str | os.PathLike, obj: Any) -> None:
    """Atomically writes `obj` as indented JSON."""
    _save_atomic(
        path, lambda stream: stream.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    )


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields (1-based line number, object) of a (.gz) JSONL file, skipping blank lines.

    Malformed JSON, a non-object line or non-UTF-8 bytes raise ValueError naming `path:line`.
    """
    path = paths.as_path(path)
    for number, raw in _numbered_lines(path):
        line = _decode(raw, path, line_offset=number - 1)
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: malformed JSON ({error.msg})") from error
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(obj).__name__}")
        _check_surrogates(line, obj, f"{path}:{number}")
        yield number, obj


def load_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Reads a (.gz) JSONL file of objects; errors name the file and line."""
    return [obj for _, obj in iter_jsonl(path)]
