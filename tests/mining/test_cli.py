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
