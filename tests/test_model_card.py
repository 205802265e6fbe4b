"""The shipped model's card: what the Hub reads from it, that it stands alone, and that it is what
`scripts/model_card.py --hub` generates from the committed records (nothing edited by hand)."""

import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import model_card  # noqa: E402

SPEC = "records/shipped/card.json"
CARD = REPO / "models" / "minilm-l6-caliber-finance" / "README.md"


@pytest.fixture(scope="module")
def spec():
    return model_card.load_spec(Path(SPEC), REPO)


def test_the_hub_reads_the_card_metadata():
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import model_index_to_eval_results

    card = ModelCard.load(CARD)
    data = card.data.to_dict()
    assert data["license"] == "apache-2.0"
    assert data["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert data["language"] == ["en"] and data["datasets"] == ["PatronusAI/financebench"]
    assert data["library_name"] == "sentence-transformers"
    assert {"sentence-transformers", "finance"} <= set(data["tags"])
    name, results = model_index_to_eval_results(data["model-index"])
    assert name == "minilm-l6-caliber-finance"
    by_metric = {result.metric_type: result for result in results}
    record = json.loads((REPO / "records/shipped/minilm-l6-caliber-finance.json").read_text())
    assert by_metric["ndcg_at_10"].metric_value == round(record["financebench"]["ndcg_at_10"], 4)
    assert by_metric["ndcg_at_10"].dataset_type == "PatronusAI/financebench"
    assert by_metric["numgap_d"].metric_value == round(record["numgap"]["overall"]["D"], 4)
    # The same metadata through the lower-level reader the Hub's tools use.
    from huggingface_hub import metadata_load

    assert metadata_load(CARD)["model-index"] == data["model-index"]


def test_the_card_stands_alone():
    """A copy of the model folder carries no docs/ or records/: the card links nowhere into this
    repository, names its own model, and has no internal labels or issue numbers."""
    text = CARD.read_text()
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert all(link.startswith("https://") for link in links), links
    assert "docs/" not in text and "lp long" not in text and "provenance unknown" not in text
    assert "+dirty" not in text and not re.search(r"\bissues? #\d", text, re.IGNORECASE)
    assert text.count("\n# ") == 1 and "# minilm-l6-caliber-finance" in text
    for heading in ("## Usage", "## Intended use and limits", "## Training", "## Evaluation",
                    "## Licence", "## Citation"):  # fmt: skip
        assert f"\n{heading}\n" in text, heading
    assert "@misc{caliber," in text and "@misc{leaf," in text


def test_the_card_is_generated_from_the_committed_records(spec):
    """Generating it again from the records (at the commit it names) gives the card byte for
    byte, so every number in it is the records' and none was edited by hand."""
    text = CARD.read_text()
    commit = re.search(r"generated at commit (\S+) by", text).group(1)
    assert "+dirty" not in commit and re.fullmatch(r"[0-9a-f]{7,40}", commit), commit
    assert model_card.hub_card(spec, REPO, SPEC, commit) == text


def test_the_card_compares_against_the_teacher_plain_minilm_and_bm25_with_intervals(spec):
    text = CARD.read_text()
    mine = spec["student_results"]
    for key in ("teacher", "minilm", "bm25"):
        other = spec["baseline_results"][key]
        row = model_card.paired(mine, other, "financebench", "ndcg_at_10")
        assert f"| {spec['names'][key]} | {model_card.paired_cell(row)} |" in text, key
    # The per-direction NumGap table: each scale swap by its direction.
    for rule in ("billion->million", "million->billion", "million->thousand", "%->bps"):
        assert f"| unit | {rule} |" in text, rule


def test_the_paired_cell_reads_as_the_compare_tool_computes(spec):
    """The card's interval is `caliber_jax.compare`'s: the same function, resamples and seed."""
    from caliber_jax import compare

    rows, _ = compare.compare_files(
        [str(REPO / path) for path in ("records/study_mpnet_long/results/Teacher/"
                                       "financebench+mrl.json", *spec["student"]["results"])],
        task="financebench", metric="ndcg_at_10", resamples=10_000, seed=0,
    )  # fmt: skip
    mine = spec["student_results"]
    card_row = model_card.paired(mine, spec["baseline_results"]["teacher"], "financebench",
                                 "ndcg_at_10")  # fmt: skip
    for field in ("diff", "ci_low", "ci_high", "p_value", "n"):
        assert rows[0][field] == pytest.approx(card_row[field]), field
