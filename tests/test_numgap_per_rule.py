"""scripts/numgap_per_rule.py: a per-rule NumGap set from a prepared folder's held-out filings."""

import json
import subprocess
import sys
from pathlib import Path

from caliber_jax.data import corpus, numgap, perturb

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "numgap_per_rule.py"
SCALES = ("million", "billion", "thousand")
TOPICS = (
    "pension plan obligations discount rate retirees",
    "lease liabilities tenants office",
    "deferred tax assets valuation allowance",
    "senior notes credit facility lenders",
)


def passage(doc: str, index: int) -> dict:
    """A passage of `doc` whose amount carries one scale word (each in turn) and a percentage."""
    topic = TOPICS[index % len(TOPICS)]
    text = (
        f"The {topic} rose {index + 3}.{index % 9}% to ${index + 11} {SCALES[index % 3]} in fiscal "
        f"20{10 + index % 9}. Management notes that the {topic} stayed above "
        f"${(index + 2) * 1000:,} compared with the prior year. " + "Filler text. " * (index % 5)
    )
    return {"id": f"{doc}:{index}", "text": text, "doc_name": doc}


def write_folder(folder: Path) -> list[dict]:
    passages = [passage(doc, i) for doc in ("KEEP_2020_10K", "HELD_2021_10K") for i in range(60)]
    corpus.save_jsonl(folder / "passages.jsonl", passages)
    (folder / "stats.json").write_text(json.dumps({"heldout_documents": ["HELD_2021_10K"]}))
    return passages


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          check=False, cwd=REPO)  # fmt: skip


def test_builds_every_scale_swap_from_held_out_passages_minus_the_excluded(tmp_path):
    passages = write_folder(tmp_path)
    excluded = [p for p in passages if p["doc_name"] == "HELD_2021_10K"][:5]
    exclude = tmp_path / "numgap_test.jsonl"
    corpus.save_jsonl(exclude, [
        {"category": "unit", "anchor": p["text"], "perturbed": p["text"] + " x",
         "distractor": "d", "anchor_id": p["id"], "distractor_id": "d"} for p in excluded
    ])  # fmt: skip
    out = tmp_path / "dev.jsonl"
    result = run(f"--data={tmp_path}", "--per_rule=4", f"--exclude={exclude}", f"--output={out}")
    assert result.returncode == 0, result.stderr
    records = numgap.load_numgap(out)
    counts: dict[str, int] = {}
    for record in records:
        assert record["anchor_id"].startswith("HELD_2021_10K:")  # held-out documents only
        rule = perturb.edit_rule(record["anchor"], record["perturbed"], "unit")
        counts[rule] = counts.get(rule, 0) + 1
    assert not {r["anchor"] for r in records} & {p["text"] for p in excluded}
    scale_swaps = {f"{a}->{b}" for a in SCALES for b in SCALES if a != b}
    assert {rule: counts.get(rule) for rule in scale_swaps} == dict.fromkeys(scale_swaps, 4)
    assert result.stdout.startswith(f"{out}: {len(records)} records; ")
    assert "billion->thousand 4" in result.stdout


def test_a_folder_without_held_out_documents_is_one_line(tmp_path):
    write_folder(tmp_path)
    (tmp_path / "stats.json").write_text(json.dumps({"heldout_documents": []}))
    result = run(f"--data={tmp_path}", f"--output={tmp_path / 'dev.jsonl'}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"{tmp_path / 'stats.json'}: no heldout_documents (prepare with "
        "prepare.heldout_fraction > 0)"
    ]
    assert not (tmp_path / "dev.jsonl").exists()
