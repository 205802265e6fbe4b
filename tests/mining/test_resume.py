"""Resumable mining: a torn partial judgments file, and a real SIGKILL mid-judging."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from caliber_jax.data import corpus
from caliber_jax.mining import mining

REPO = Path(__file__).resolve().parents[2]


class CountingJudge:
    identity = "counting"

    def __init__(self):
        self.graded = []

    def grade(self, queries, chunks):
        self.graded += [c["id"] for c in chunks]
        return [1 + len(c["id"]) % 4 for c in chunks]


def test_judging_resumes_after_the_last_complete_batch(tmp_path):
    chunks = {f"D:{i}": {"id": f"D:{i}", "text": f"chunk {i}"} for i in range(10)}
    candidates = [
        {"query_id": "q", "query": "q", "doc_name": "D", "chunk_id": f"D:{i}"} for i in range(10)
    ]
    fresh = mining.judge_candidates(
        CountingJudge(),
        candidates,
        chunks,
        tmp_path / "a.jsonl",
        batch_size=3,
        log_fn=lambda m: None,
    )
    # A kill after two batches, in the middle of writing the third line of the third batch.
    full = (tmp_path / "a.jsonl").read_bytes().splitlines(keepends=True)
    partial = tmp_path / "b.partial.jsonl"
    partial.write_bytes(b"".join(full[:6]) + full[6][:10])
    judge = CountingJudge()
    resumed = mining.judge_candidates(
        judge, candidates, chunks, tmp_path / "b.jsonl", batch_size=3, log_fn=lambda m: None
    )
    assert judge.graded == [f"D:{i}" for i in range(6, 10)]
    assert resumed == fresh and not partial.exists()
    assert (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()
    # A finished stage is read back, not judged again.
    again = CountingJudge()
    assert (
        mining.judge_candidates(
            again, candidates, chunks, tmp_path / "b.jsonl", batch_size=3, log_fn=lambda m: None
        )
        == fresh
        and again.graded == []
    )


def _command(workdir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "caliber_jax.mine",
        "--config",
        "configs/mine.py:tiny",
        "--workdir",
        str(workdir),
        "--stop_after",
        "triples",
        "--config.judge.batch_size=2",
    ]


def test_sigkill_mid_mining_then_rerun_gives_identical_output(tmp_path):
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    reference = tmp_path / "reference"
    subprocess.run(_command(reference), cwd=REPO, env=env, check=True, capture_output=True)

    killed = tmp_path / "killed"
    partial = killed / "iter_0" / "judgments.partial.jsonl"
    process = subprocess.Popen(
        _command(killed), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        if partial.exists() and partial.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    candidates = corpus.load_jsonl(killed / "iter_0" / "candidates.jsonl")
    done = partial.read_bytes().count(b"\n")
    assert 0 < done < len(candidates), "the kill must land while judging"
    assert not (killed / "iter_0" / "judgments.jsonl").exists()

    rerun = subprocess.run(
        _command(killed), cwd=REPO, env=env, check=True, capture_output=True, text=True
    )
    assert "judge: resuming judgments.jsonl" in rerun.stdout
    for name in (
        "chunks.jsonl",
        "iter_0/queries.jsonl",
        "iter_0/candidates.jsonl",
        "iter_0/judgments.jsonl",
        "iter_0/triples.jsonl",
        "judge_calibration.json",
    ):
        assert (killed / name).read_bytes() == (reference / name).read_bytes(), name
    assert corpus.load_jsonl(killed / "iter_0" / "triples.jsonl")
