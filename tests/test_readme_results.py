"""README.md's results table is the one `scripts/model_card.py --hub` generates from the records it
cites: every figure, interval and p in it comes from those files, so a new shipped student or a new
record changes the table by running that command, never by hand."""

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import model_card  # noqa: E402

SPEC = "records/shipped/card.json"


def test_the_readme_table_equals_the_records_it_cites():
    readme = (REPO / "README.md").read_text()
    block = model_card.readme_table_from(REPO / "README.md", SPEC)
    spec = model_card.load_spec(Path(SPEC), REPO)
    assert block == model_card.readme_table(spec, SPEC)
    # It cites each record it reads, and each cited record exists.
    cited = re.findall(r"`(records/[^`]+\.json)`", block)
    assert set(cited) == set(spec["student"]["results"]) | {
        path for key in spec["readme_rows"] for b in spec["baselines"] if b["key"] == key
        for path in b["results"]
    }  # fmt: skip
    assert all((REPO / path).is_file() for path in cited)
    assert readme.count(model_card.README_END) == 1


def test_the_readme_table_has_the_rows_a_reader_compares():
    block = model_card.readme_table_from(REPO / "README.md", SPEC)
    for name in ("minilm-l6-caliber-finance", "all-mpnet-base-v2", "all-MiniLM-L6-v2", "BM25",
                 "LEAF"):  # fmt: skip
        assert f"| {name}" in block or f"| **{name}" in block, name
    assert "[95% CI], p" in block


def test_splice_replaces_only_the_block():
    readme = "intro\n" + model_card.README_START.format(spec=SPEC) + "\nold\n" + (
        model_card.README_END + "\nafter\n")  # fmt: skip
    new = model_card.splice_readme(readme, "NEW\n")
    assert new == "intro\nNEW\nafter\n"
