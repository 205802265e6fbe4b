"""Smoke run of the main job (launch/demo.sh's study script) on a cut-down demo config."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_study_smoke_runs_every_stage(tmp_path):
    out = tmp_path / "smoke"
    result = subprocess.run(
        [sys.executable, "scripts/study.py", "--preset", "smoke", "--output", str(out)],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = json.loads((out / "study.json").read_text())
    assert list(study["results"]) == ["Initial", "Teacher", "LEAF s0", "Caliber s0"]
    for label, results in study["results"].items():
        assert 0.0 <= results["financebench"]["ndcg_at_10"] <= 1.0, label
        assert 0.0 <= results["numgap"]["overall"]["D"] <= 1.0, label
    # The teacher is the real all-MiniLM-L6-v2: its retrieval is far above the 3-layer Initial.
    assert study["results"]["Teacher"]["financebench"]["ndcg_at_10"] > 0.4
    assert study["results"]["Caliber s0"]["train_summary"]["step"] == 3
    assert (out / "LEAF_s0" / "hf" / "modules.json").is_file()
    assert "## FinanceBenchRetrieval" in (out / "study.md").read_text()
    assert any((out / "figures").glob("*.png"))
