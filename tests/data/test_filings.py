"""filings.jsonl.gz from release-style PDFs: text, fields and schema round-trip, and bad inputs."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from caliber_jax.data import corpus, filings

REPO = Path(__file__).resolve().parents[2]
# The schema of the shared filings.jsonl.gz (FinanceBench), key order included.
SCHEMA = {
    "doc_name": str,
    "company": str,
    "doc_type": str,
    "doc_period": int,
    "gics_sector": str,
    "financebench_eval_doc": bool,
    "text": str,
}
PAGES = {
    "ACME_2022_10K": [["ACME CORP FORM 10-K", "Revenue was $1,234.5 million (up 3%)."],
                      ["Page 2  ", " ", " ", "end"]],
    "ACME_2023Q1_10Q": [["Net income: 42 (in millions)"], [], ["Item 4. Controls"]],
}  # fmt: skip
# Their text: no space at line ends, blank-only lines dropped, one form feed ends each page.
TEXTS = {
    "ACME_2022_10K": "ACME CORP FORM 10-K\nRevenue was $1,234.5 million (up 3%).\fPage 2\nend\f",
    "ACME_2023Q1_10Q": "Net income: 42 (in millions)\f\fItem 4. Controls\f",
}


def pdf_bytes(pages: list[list[str]]) -> bytes:
    """A minimal PDF whose pages hold these lines of Helvetica text (nothing else to install)."""

    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(len(pages)))
    bodies = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]
    for i, lines in enumerate(pages):
        shown = " 0 -16 Td ".join(f"({escape(line)}) Tj" for line in lines)
        operators = f"BT /F1 12 Tf 72 720 Td {shown} ET"
        bodies.append(
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>"
        )
        bodies.append(f"<< /Length {len(operators)} >>\nstream\n{operators}\nendstream")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(bodies, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(bodies) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += (
        f"trailer\n<< /Size {len(bodies) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    )
    return bytes(out)


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def release(tmp_path) -> Path:
    """A FinanceBench release layout: two PDFs, three listed filings (one PDF absent, one listed
    twice) and a question whose evidence is in the 10-Q."""
    root = tmp_path / "financebench"
    (root / "pdfs").mkdir(parents=True)
    for name, pages in PAGES.items():
        (root / "pdfs" / f"{name}.pdf").write_bytes(pdf_bytes(pages))
    info = [
        {"doc_name": name, "company": "Acme", "gics_sector": "Industrials", "doc_type": kind,
         "doc_period": period, "doc_link": "https://example.com/x.pdf"}
        for name, kind, period in (("ACME_2023Q1_10Q", "10q", 2023), ("ACME_2022_10K", "10k", 2022),
                                   ("ACME_2021_10K", "10k", 2021))
    ]  # fmt: skip
    _write_jsonl(root / "data" / "financebench_document_information.jsonl", [*info, info[0]])
    question = {"question": "Net income?", "answer": "42", "doc_name": "ACME_2023Q1_10Q",
                "evidence": [{"evidence_text": "Net income: 42", "doc_name": "ACME_2023Q1_10Q",
                              "evidence_page_num": 0}]}  # fmt: skip
    _write_jsonl(root / "data" / "financebench_open_source.jsonl", [question])
    return root


def _build(release: Path, output: Path, **kwargs) -> dict:
    return filings.build_filings(
        release / "pdfs",
        release / "data" / "financebench_document_information.jsonl",
        release / "data" / "financebench_open_source.jsonl",
        output,
        progress=False,
        **kwargs,
    )


def test_records_round_trip_text_fields_and_schema(release, tmp_path):
    notes = []
    output = tmp_path / "out" / "filings.jsonl.gz"
    summary = _build(release, output, skip_missing=True, log=notes.append)
    assert summary["filings"] == 2 and summary["missing"] == ["ACME_2021_10K"]
    assert any("ACME_2021_10K" in note for note in notes)
    with gzip.open(output, "rt", encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle]
    assert [r["doc_name"] for r in records] == ["ACME_2022_10K", "ACME_2023Q1_10Q"]  # sorted
    for record in records:
        assert list(record) == list(SCHEMA)
        assert {k: type(v) for k, v in record.items()} == SCHEMA
        assert record["text"] == TEXTS[record["doc_name"]]
    ten_k, ten_q = records
    assert (ten_k["doc_type"], ten_k["doc_period"], ten_k["company"]) == ("10k", 2022, "Acme")
    assert not ten_k["financebench_eval_doc"] and ten_q["financebench_eval_doc"]
    # What prepare and mining read.
    assert [r["doc_name"] for r in corpus.load_records(output)] == [r["doc_name"] for r in records]
    assert summary["characters"] == sum(len(r["text"]) for r in records)


def test_the_same_pdfs_give_the_same_bytes(release, tmp_path):
    """No timestamp in the gzip header; two worker processes write what one does."""
    one = tmp_path / "one" / "filings.jsonl.gz"
    two = tmp_path / "two" / "filings.jsonl.gz"
    _build(release, one, skip_missing=True)
    _build(release, two, skip_missing=True, workers=2)
    assert one.read_bytes() == two.read_bytes()
    plain = tmp_path / "filings.jsonl"
    _build(release, plain, skip_missing=True)
    assert plain.read_bytes() == gzip.decompress(one.read_bytes())


def test_a_missing_pdf_is_named_and_nothing_is_written(release, tmp_path):
    output = tmp_path / "filings.jsonl.gz"
    missing = release / "pdfs" / "ACME_2021_10K.pdf"
    with pytest.raises(FileNotFoundError, match=rf"^{missing}: PDF not found; pass --skip_missing"):
        _build(release, output)
    assert list(tmp_path.iterdir()) == [release]


def test_an_unreadable_pdf_is_named_and_nothing_is_written(release, tmp_path):
    broken = release / "pdfs" / "ACME_2022_10K.pdf"
    broken.write_bytes(pdf_bytes(PAGES["ACME_2022_10K"])[:-60])  # cut short, as one in the release
    output = tmp_path / "filings.jsonl.gz"
    message = rf"^{broken}: cannot be read as a PDF \(.*\); pass --skip_unreadable to leave it out$"
    with pytest.raises(ValueError, match=message):
        _build(release, output, skip_missing=True)
    assert list(tmp_path.iterdir()) == [release]  # no output, no temporary file
    notes = []
    summary = _build(release, output, skip_missing=True, skip_unreadable=True, log=notes.append)
    assert summary["unreadable"] == ["ACME_2022_10K"] and summary["filings"] == 1
    assert notes[-1].startswith(f"{broken}: cannot be read as a PDF (") and "left out" in notes[-1]
    assert [r["doc_name"] for r in corpus.load_records(output)] == ["ACME_2023Q1_10Q"]


def test_a_bad_document_information_line_is_named(release, tmp_path):
    info = release / "data" / "financebench_document_information.jsonl"
    rows = [json.loads(line) for line in info.read_text().splitlines()]
    rows[1]["doc_period"] = "2022"
    _write_jsonl(info, rows)
    with pytest.raises(
        ValueError, match=rf"^{info}:2: field 'doc_period' is missing or not an int"
    ):
        _build(release, tmp_path / "f.jsonl.gz", skip_missing=True)


def test_command_builds_from_a_release_folder(release, tmp_path):
    script = REPO / "scripts" / "build_filings.py"
    output = tmp_path / "filings.jsonl.gz"
    command = [sys.executable, str(script), f"--release={release}", f"--output={output}"]
    refused = subprocess.run(command, capture_output=True, text=True, check=False)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines() == [
        f"error: {release / 'pdfs' / 'ACME_2021_10K.pdf'}: PDF not found; pass --skip_missing "
        f"to build from the 2 of 3 listed PDFs that are there"
    ]
    built = subprocess.run([*command, "--skip_missing"], capture_output=True, text=True,
                           check=False)  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    assert built.stdout.startswith(f"{output}: 2 filings, ")
    assert built.stdout.rstrip().endswith("(1 listed PDFs absent, 0 unreadable)")
    assert len(list(corpus.load_records(output))) == 2
