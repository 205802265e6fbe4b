"""FinanceBench filings as JSONL: the text of each release PDF with its document information.

The public FinanceBench release (github.com/patronus-ai/financebench) ships the filings as PDFs
(`pdfs/<doc_name>.pdf`) beside `data/financebench_document_information.jsonl` and the questions
(`data/financebench_open_source.jsonl`). `build_filings` writes one record per filing:

    {"doc_name", "company", "doc_type", "doc_period": int, "gics_sector",
     "financebench_eval_doc": bool, "text"}

sorted by doc_name, with each page's text followed by a form feed (as pdftotext writes it).
The text comes from PDFium (`pip install pypdfium2`, the `filings` extra). The shared
filings.jsonl.gz was made with pdftotext from 271 of the release's filings; rebuilt from the
release's PDFs, those 271 have the same fields and pages and 99.8% of its words (96% at least per
filing; dot leaders aside) and of its numbers, with fewer blank lines between blocks. pypdf, tried
first, split words on some filings (88% of the words of AMAZON_2020_10K) and took 50x longer.
`financebench_eval_doc` is true for the filings a question or its evidence comes from.
`scripts/build_filings.py` is the command.
"""

import concurrent.futures
import contextlib
import gzip
import io
import json
import multiprocessing
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from caliber_jax import paths
from caliber_jax.data import corpus

# The document information fields a record copies, in the record's key order.
INFO_FIELDS = ("doc_name", "company", "doc_type", "doc_period", "gics_sector")
PAGE_BREAK = "\f"
_BLANK_RUNS = re.compile(r"\n{3,}")


def load_document_information(path: str | os.PathLike) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of `financebench_document_information.jsonl` (`INFO_FIELDS` only), one per
    doc_name (the first where a name repeats), and a note for each repeat that differs."""
    rows: dict[str, dict[str, Any]] = {}
    notes = []
    for line, record in corpus.iter_jsonl(path):
        row = {}
        for field in INFO_FIELDS:
            value = record.get(field)
            want_int = field == "doc_period"
            valid = (
                isinstance(value, int) and not isinstance(value, bool)
                if want_int
                else isinstance(value, str) and bool(value.strip())
            )
            if not valid:
                kind = "an integer" if want_int else "text"
                raise ValueError(f"{path}:{line}: field {field!r} is missing or not {kind}")
            row[field] = value
        first = rows.setdefault(row["doc_name"], row)
        if first is not row and first != row:
            notes.append(
                f"{path}:{line}: {row['doc_name']} listed again with other fields "
                f"({_difference(first, row)}): the first listing is used"
            )
    return list(rows.values()), notes


def _difference(first: dict[str, Any], again: dict[str, Any]) -> str:
    return ", ".join(f"{k} {first[k]!r} then {again[k]!r}" for k in first if first[k] != again[k])


def load_eval_doc_names(path: str | os.PathLike) -> set[str]:
    """The doc_names that FinanceBench questions (`financebench_open_source.jsonl`) and their
    evidence come from."""
    names = set()
    for line, record in corpus.iter_jsonl(path):
        evidence = record.get("evidence") or []
        if not isinstance(evidence, list):
            raise ValueError(f"{path}:{line}: field 'evidence' is not a list")
        found = [record.get("doc_name")] + [e.get("doc_name") for e in evidence]
        if not all(isinstance(name, str) and name for name in found):
            raise ValueError(f"{path}:{line}: a question or evidence without a doc_name")
        names.update(found)
    return names


def extract_text(pdf: str | os.PathLike) -> str:
    """The text of a PDF in reading order (PDFium's, through pypdfium2), each page's followed by
    a form feed.

    Raises:
        FileNotFoundError: no file at `pdf`.
        ValueError: the file cannot be read as a PDF (naming it).
    """
    import pypdfium2  # only this command needs it (the `filings` extra)

    pdf = Path(pdf)
    if not pdf.is_file():
        raise FileNotFoundError(f"{pdf}: PDF not found")
    pages = []
    try:
        document = pypdfium2.PdfDocument(pdf)
    except pypdfium2.PdfiumError as error:
        raise ValueError(f"{pdf}: cannot be read as a PDF ({_reason(error)})") from None
    try:
        for index in range(len(document)):
            page = document[index]
            text_page = page.get_textpage()
            pages.append(text_page.get_text_range())
            text_page.close()
            page.close()
    except pypdfium2.PdfiumError as error:
        where = f"{pdf}: page {len(pages) + 1}"
        raise ValueError(f"{where} cannot be read ({_reason(error)})") from None
    finally:
        document.close()
    return "".join(tidy_page(page) + PAGE_BREAK for page in pages)


def _reason(error: Exception) -> str:
    return " ".join(str(error).split()).rstrip(".") or type(error).__name__


def tidy_page(text: str) -> str:
    """PDFium's text of a page as pdftotext writes it: lines end in "\\n" (not "\\r\\n") and
    no space; one blank line at most; a hyphen where PDFium writes U+FFFE or U+0002 (a soft
    hyphen of the PDF's encoding, drawn as a hyphen: "spill-control" where pdftotext, dropping
    it, writes "spillcontrol"); a form feed inside a page (a page break to a reader) a newline."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace(PAGE_BREAK, "\n")
    text = text.replace("\ufffe", "-").replace("\x02", "-")
    lines = [line.rstrip() for line in text.split("\n")]
    return _BLANK_RUNS.sub("\n\n", "\n".join(lines))


def make_record(info: dict[str, Any], text: str, eval_doc_names: set[str]) -> dict[str, Any]:
    """One filing's record, keys in the file's order."""
    record = {field: info[field] for field in INFO_FIELDS}
    record[corpus.EVAL_DOC_FIELD] = info["doc_name"] in eval_doc_names
    record["text"] = text
    return record


def build_filings(
    pdf_dir: str | os.PathLike,
    document_information: str | os.PathLike,
    questions: str | os.PathLike,
    output: str | os.PathLike,
    *,
    skip_missing: bool = False,
    skip_unreadable: bool = False,
    workers: int = 1,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Writes `output` (.jsonl.gz, or .jsonl) whole or not at all: one record per listed filing
    whose PDF `pdf_dir/<doc_name>.pdf` is there.

    Args:
      pdf_dir: the release's `pdfs/` folder.
      document_information: `financebench_document_information.jsonl`.
      questions: `financebench_open_source.jsonl` (sets `financebench_eval_doc`).
      output: the file to write.
      skip_missing: leave out the filings whose PDF is absent (else: an error naming one).
      skip_unreadable: leave out (with a note) the filings whose PDF cannot be read (else: an
        error naming it). The release's INTEL_2023_8K_dated-2023-02-10.pdf is cut short.
      workers: processes extracting text at once.
      progress: a progress bar on stderr.
      log: where notes (repeated listings, skipped PDFs) go.

    Returns:
      {"filings", "characters", "missing": [doc_name, ...], "unreadable": [...], "output"}.
    """
    if workers < 1:
        raise ValueError(f"workers={workers}: must be at least 1")
    pdf_dir = Path(pdf_dir)
    if not pdf_dir.is_dir():
        raise FileNotFoundError(f"{pdf_dir}: PDF folder not found")
    rows, notes = load_document_information(document_information)
    eval_doc_names = load_eval_doc_names(questions)
    for note in notes:
        log(note)
    rows.sort(key=lambda row: row["doc_name"])
    present, missing = [], []
    for row in rows:
        if _pdf_path(pdf_dir, row).is_file():
            present.append(row)
        else:
            missing.append(row["doc_name"])
    if missing and not skip_missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise FileNotFoundError(
            f"{pdf_dir / (missing[0] + '.pdf')}: PDF not found{more}; pass --skip_missing to "
            f"build from the {len(present)} of {len(rows)} listed PDFs that are there"
        )
    if missing:
        log(f"{len(missing)} of {len(rows)} listed PDFs are not in {pdf_dir}, left out: "
            f"{', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}")  # fmt: skip
    if not present:
        raise FileNotFoundError(f"{pdf_dir}: none of the {len(rows)} listed PDFs is there")
    totals = {"filings": 0, "characters": 0}
    unreadable = []

    def write(tmp: Path) -> None:
        texts = _extract_all([_pdf_path(pdf_dir, row) for row in present], workers=workers)
        bar = tqdm(total=len(present), desc="filings", unit="pdf", disable=not progress)
        name = Path(output).name
        gzip_name = name.removesuffix(".gz") if name.endswith(".gz") else None
        with contextlib.closing(texts), bar, _open_text(tmp, gzip_name=gzip_name) as out:
            for row, (text, error) in zip(present, texts, strict=True):
                bar.update()
                if error is not None:
                    if not skip_unreadable:
                        raise ValueError(f"{error}; pass --skip_unreadable to leave it out")
                    log(f"{error}: left out")
                    unreadable.append(row["doc_name"])
                    continue
                record = make_record(row, text, eval_doc_names)
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                totals["filings"] += 1
                totals["characters"] += len(text)

    paths.write_atomic(output, write)
    return {**totals, "missing": missing, "unreadable": unreadable, "output": str(output)}


def _pdf_path(pdf_dir: Path, row: dict[str, Any]) -> Path:
    return pdf_dir / f"{row['doc_name']}.pdf"


def _extract_all(pdfs: list[Path], *, workers: int) -> Iterator[tuple[str | None, str | None]]:
    """(text, None) or (None, why it cannot be read) of each of `pdfs`, in order, extracted
    `workers` at a time."""
    if workers == 1:
        yield from map(_try_extract_text, pdfs)
        return
    # Spawned, not forked: a forked copy of a process running threads (JAX's) can deadlock.
    context = multiprocessing.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context)
    try:
        yield from pool.map(_try_extract_text, pdfs)
    finally:  # a stopped build does not wait for the queued PDFs
        pool.shutdown(cancel_futures=True)


def _try_extract_text(pdf: Path) -> tuple[str | None, str | None]:
    try:
        return extract_text(pdf), None
    except ValueError as error:
        return None, str(error)


@contextlib.contextmanager
def _open_text(path: Path, *, gzip_name: str | None) -> Iterator[io.TextIOBase]:
    """`path` opened for UTF-8 text, gzipped when `gzip_name` (the name in the gzip header) is
    given: without a timestamp, so the same PDFs give the same bytes."""
    with open(path, "xb") as raw:
        if gzip_name is None:
            with io.TextIOWrapper(raw, encoding="utf-8", newline="\n") as out:
                yield out
            return
        with (
            gzip.GzipFile(filename=gzip_name, mode="wb", fileobj=raw, mtime=0) as packed,
            io.TextIOWrapper(packed, encoding="utf-8", newline="\n") as out,
        ):
            yield out
