"""launch/*.sh: the local launcher's exit statuses with stand-in commands (no JAX), and every
cluster launcher's handling of `train`'s preempted status 75 (checkpointed: requeue me)."""

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAUNCH = REPO / "launch"
PREEMPTED = 75  # caliber_jax.train.EXIT_PREEMPTED (tests may not import train)


def run_local(script: str, grace: int = 120) -> tuple[int, dict[int, int], str, float]:
    """Two processes running `bash -c script` ($JAX_PROCESS_ID set); returns the launcher's
    status, each process's reported exit code, its output and its wall time."""
    env = dict(os.environ, PREEMPT_GRACE_S=str(grace))
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(LAUNCH / "local_multiprocess.sh"), "2", "--", "bash", "-c", script],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    exits = re.findall(r"local_multiprocess: process (\d+) exited with (\d+)", result.stderr)
    return (result.returncode, {int(i): int(c) for i, c in exits}, result.stderr,
            time.monotonic() - started)  # fmt: skip


def test_a_preempted_process_waits_for_its_peers_own_stop():
    # Process 1 takes 2 s longer to finish its own stop: it is not killed, the launcher says 75.
    code, exits, log, _ = run_local("sleep $((JAX_PROCESS_ID * 2)); exit 75")
    assert code == PREEMPTED, log
    assert exits == {0: PREEMPTED, 1: PREEMPTED}, log
    assert "Killed" not in log


def test_a_peer_past_the_grace_period_is_killed_and_the_run_still_requeues():
    code, exits, log, seconds = run_local("((JAX_PROCESS_ID)) && exec sleep 60; exit 75", grace=1)
    assert code == PREEMPTED, log
    assert exits == {0: PREEMPTED, 1: 128 + 9}, log  # SIGKILL after the grace second
    assert seconds < 30


def test_a_failure_stops_the_others_at_once_and_wins_over_a_preemption():
    code, exits, log, seconds = run_local("((JAX_PROCESS_ID)) && exec sleep 60; exit 3")
    assert code == 3 and exits == {0: 3, 1: 128 + 9}, log
    assert seconds < 30
    code, exits, log, _ = run_local("((JAX_PROCESS_ID)) && { sleep 1; exit 4; }; exit 75")
    assert code == 4 and exits == {0: PREEMPTED, 1: 4}, log
    code, exits, log, _ = run_local("exit 0")
    assert code == 0 and exits == {0: 0, 1: 0}, log


@pytest.mark.parametrize("name", ["single_gpu.sh", "multi_gpu_node.sh"])
def test_one_host_launchers_hand_python_the_signal_and_the_status(name):
    """`exec`: a scheduler's SIGTERM to the script reaches `train` (a bash parent would die of it
    and leave `train` running unaware), and `train`'s 75 is the script's status."""
    text = (LAUNCH / name).read_text()
    assert re.search(r"^exec python -m caliber_jax\.train ", text, re.M), text
    assert "75" in text


def stand_ins(tmp_path: Path, **scripts: str) -> dict[str, str]:
    """An environment whose PATH finds the given stand-in tools first (name -> bash body)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        tool = bin_dir / name
        tool.write_text(f"#!/bin/bash\n{body}\n")
        tool.chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")


def test_slurm_requeues_a_preempted_job_and_lets_peers_finish():
    text = (LAUNCH / "slurm.sbatch").read_text()
    assert re.search(r"^#SBATCH --requeue$", text, re.M)
    (srun,) = [line for line in text.splitlines() if line.startswith("srun ")]
    assert "--kill-on-bad-exit" not in srun  # it would kill the peers of the first 75


def test_slurm_sbatch_with_stand_in_srun_and_scontrol(tmp_path):
    """The batch script's own logic: srun's status 75 -> `scontrol requeue <job>`, exit 75;
    other statuses -> no requeue, the same status."""
    calls = tmp_path / "calls"
    base = stand_ins(tmp_path, srun=f'echo "srun $*" >> {calls}; exit $SRUN_STATUS',
                     scontrol=f'echo "scontrol $*" >> {calls}')  # fmt: skip
    for srun_status, want in ((PREEMPTED, PREEMPTED), (0, 0), (1, 1)):
        calls.write_text("")
        env = dict(base, SLURM_JOB_ID="123", SRUN_STATUS=str(srun_status))
        result = subprocess.run(
            ["bash", str(LAUNCH / "slurm.sbatch"), "configs/caliber.py", str(tmp_path / "run")],
            capture_output=True, text=True, env=env, timeout=30, check=False,
        )  # fmt: skip
        assert result.returncode == want, result.stderr
        logged = calls.read_text().splitlines()
        assert logged[0].startswith("srun ") and "caliber_jax.train" in logged[0]
        assert logged[1:] == (["scontrol requeue 123"] if srun_status == PREEMPTED else [])


@pytest.mark.parametrize(
    ("workers", "ssh_status", "want"),
    [([75, 75], 0, PREEMPTED), ([0, 0], 0, 0), ([75, 1], 0, 1), ([], 255, 255), ([], 0, 1)],
)
def test_tpu_pod_reports_the_workers_statuses(tmp_path, workers, ssh_status, want):
    """A stand-in gcloud prints what each worker's command echoes; the script's status is a
    worker's failure, else 75 for a preempted run, else gcloud's."""
    lines = "".join(f"echo 'Using ssh batch size of 1.'; echo 'caliber_jax exit status {code}';"
                    for code in workers)  # fmt: skip
    env = stand_ins(tmp_path, gcloud=f"{lines} exit {ssh_status}")
    result = subprocess.run(
        ["bash", str(LAUNCH / "tpu_pod.sh"), "tpu", "zone", "configs/caliber.py", "gs://b/run"],
        capture_output=True, text=True, env=env, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == want, result.stderr
