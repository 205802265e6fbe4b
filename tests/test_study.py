"""Smoke run of the main job (launch/demo.sh's study script) on a cut-down demo config."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow(60)
def test_study_smoke_runs_every_stage(tmp_path, financebench_third):
    out = tmp_path / "smoke"
    result = subprocess.run(
        [sys.executable, "scripts/study.py", "--preset", "smoke", "--output", str(out),
         f"--financebench={financebench_third}"],
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
    report = (out / "study.md").read_text()
    assert "## FinanceBenchRetrieval" in report
    # Paired tests on the same queries / NumGap records, Caliber against LEAF among them.
    for table in ("financebench ndcg_at_10", "numgap D", "numgap M"):
        assert f"## Paired comparisons, {table} (n = " in report, table
    assert "| Caliber s0 | LEAF s0 |" in report
    assert any((out / "figures").glob("*.png"))
    # The last lines: every row computed now, then what the demo's numbers do and do not show.
    lines = result.stdout.strip().splitlines()
    assert "study: computed now: Initial, Teacher, LEAF s0, Caliber s0" in lines
    assert "study: restored from records: none" in lines
    epilogue = _study_module().DEMO_EPILOGUE.splitlines()
    assert lines[-len(epilogue) :] == epilogue


def _study_module():
    import importlib.util

    sys.path.insert(0, str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location("study_script", REPO / "scripts" / "study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_epilogue_quotes_the_docs_figures():
    """The demo's closing figures are the ones docs/results.md measured (rounded to 3 places)."""
    epilogue = _study_module().DEMO_EPILOGUE
    results = (REPO / "docs" / "results.md").read_text()
    assert "--preset headline-verify --filings" in epilogue
    verify = results[results.index("## Session 23") :]
    assert "**30 min 7 s**" in verify and "30 minutes from a fresh clone" in epilogue
    assert "| **Late lp verify s0** | **0.5692** | **0.1231** |" in verify
    assert "| Initial lp verify s0 (fitted start) | 0.5000 |" in verify
    assert "| Teacher all-mpnet-base-v2 | 0.6609 | 0.0038 |" in verify
    assert (
        "nDCG@10\n0.569 against the start's 0.500, NumGap-D 0.123 against the teacher's 0.004"
        in (epilogue)
    )
    assert "| **Late800, s0+s1** | **0.6083** |" in results and "**0.381** |" in results
    assert "--preset headline-late800 --seeds 0,1" in epilogue
    assert "nDCG@10 0.608 at NumGap-D 0.381" in epilogue


@pytest.mark.slow(100)
def test_numeric_preset_trains_leaf_paper_and_recipe_at_one_length(tmp_path, financebench_third):
    """`--preset numeric` (issue #16) on the bundled sample, cut down by `--overrides`: the model
    calibrating itself, LEAF and eq. 4 beside the recipe, every model scored at 128 tokens."""
    out = tmp_path / "numeric"
    overrides = (
        "--config.prepare.max_passages=48 --config.prepare.max_val_passages=16 "
        "--config.prepare.heldout_fraction=0.34 "
        "--config.prepare.numgap_quotas_test={'magnitude':4,'polarity':4} "
        "--config.prepare.numgap_quotas_dev={'magnitude':2} --config.batch_size=8 "
        "--config.data.max_length=64 --config.teacher.max_length=64 --config.total_steps=2 "
        "--config.model.num_layers=1"
    )
    result = subprocess.run(
        [sys.executable, "scripts/study.py", "--preset", "numeric", "--output", str(out),
         "--filings", "data/sample/filings.jsonl.gz", f"--financebench={financebench_third}",
         f"--overrides={overrides}"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = json.loads((out / "study.json").read_text())
    assert list(study["results"]) == ["Teacher", "LEAF s0", "Caliber-paper s0", "Numeric s0"]
    for label, results in study["results"].items():
        assert results["settings"]["max_length"] == 128, label
        assert 0.0 <= results["numgap"]["overall"]["D"] <= 1.0, label
    # The user's total_steps wins over the variants' one epoch; each variant keeps its loss.
    summaries = {
        label: r["train_summary"] for label, r in study["results"].items() if label != "Teacher"
    }
    assert all(summary["step"] == 2 for summary in summaries.values())
    configs = {label: json.loads((out / label.replace(" ", "_") / "config.json").read_text())
               for label in summaries}  # fmt: skip
    assert configs["LEAF s0"]["loss"]["lam"] == 0.0
    assert configs["Caliber-paper s0"]["loss"]["objective"] == "caliber"
    assert configs["Numeric s0"]["loss"]["objective"] == "neighbour"


def test_a_failed_stage_stops_the_study_with_one_line_and_its_status(tmp_path):
    missing = tmp_path / "no_such_filings.jsonl.gz"
    argv = [sys.executable, "scripts/study.py", "--preset", "smoke", "--output",
            str(tmp_path / "out"), "--filings", str(missing)]  # fmt: skip
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 2  # the failed stage's own status (a user error)
    assert "Traceback" not in result.stdout + result.stderr
    assert str(missing) in result.stdout  # the stage's own error line, in its summary
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("study: stopped: stage `python -m caliber_jax.prepare ")
    assert "rerun the same command to resume" in line
    # --traceback shows where it stopped.
    traced = subprocess.run([*argv, "--traceback"], cwd=REPO, capture_output=True, text=True,
                            check=False)  # fmt: skip
    assert traced.returncode != 0 and "CalledProcessError" in traced.stderr


def test_a_user_error_of_the_study_itself_is_one_line():
    sys.path.insert(0, str(REPO / "scripts"))
    import study

    line, status = study.stopped(ValueError("LEAF s1 and Teacher scored different queries"))
    assert (line, status) == (
        "study: stopped: error: LEAF s1 and Teacher scored different queries",
        2,
    )
