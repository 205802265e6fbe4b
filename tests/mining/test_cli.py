"""`python -m caliber_jax.mine` input errors: one `error:` line on stderr, exit status 2."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path, *flags):
    command = [sys.executable, "-m", "caliber_jax.mine", "--config", "configs/mine.py:tiny",
               "--workdir", str(tmp_path / "run"), *flags]  # fmt: skip
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True)


def test_missing_filings_and_bad_stage(tmp_path):
    missing = _run(tmp_path, "--config.data.filings=/nonexistent/filings.jsonl")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines()[-1].startswith("error: /nonexistent/filings.jsonl")
    stage = _run(tmp_path, "--stop_after=bogus")
    assert stage.returncode == 2
    assert stage.stderr.strip().splitlines()[-1].startswith("error: --stop_after='bogus'")


def test_results_markdown():
    from caliber_jax import mine

    comparison = {"mrr_at_5": {"base": 0.1, "exp": 0.2, "base_se": 0.01, "exp_se": 0.02,
                               "cohens_d": 0.3, "paired_d": 0.4, "count": 9}}  # fmt: skip
    result = {"iteration": 0, "queries": 5, "candidates": 10, "seconds": 12.0,
              "grades": {"1": 1, "2": 2, "3": 3, "4": 4, "None": 0},
              "new_triples": {"train": 3, "val": 1}, "new_hard_triples": {"train": 2, "val": 1},
              "train_triples": 3, "train": {"val/accuracy_before": 0.5, "val/accuracy_after": 0.75},
              "eval": {"heldout_judged": comparison,
                       "financebench_within_doc": {"vs_previous": comparison,
                                                   "vs_base": comparison}}}  # fmt: skip
    text = mine.format_markdown([result])
    assert "| 0 | 5 | 10 | 1/2/3/4 | 3 (2) | 1 (1) | 3 | 0.5000 -> 0.7500 | 12 |" in text
    assert text.count("| 0 | mrr_at_5 | 9 | 0.1000 +- 0.0100 | 0.2000 +- 0.0200 | +0.300 |") == 3
