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
PREEMPTED = 75  # caliber_jax.watchdog.EXIT_PREEMPTED (no JAX here)


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


STALLED = 124  # caliber_jax.watchdog.EXIT_STALLED
KILLED = 128 + 9  # a task srun killed (SIGKILL) before it could report its status


@pytest.mark.parametrize(
    ("tasks", "restarts", "want", "requeued"),
    [
        ("75 75", "", PREEMPTED, True),
        ("0 0", "", 0, False),
        ("1 0", "", 1, False),
        ("124 124", "", STALLED, True),
        ("75 124", "", STALLED, True),  # srun's status is the highest: 124
        ("75 kill", "", PREEMPTED, True),  # a peer killed in its own stop: srun says 137
        ("124 kill", "2", STALLED, True),
        ("124 1", "", 1, False),  # an error wins: a requeue would only repeat it
        ("kill kill", "", KILLED, False),  # no task reported: not known to be resumable
        ("124 124", "3", STALLED, False),  # MAX_STALL_REQUEUES (3) restarts already
        ("75 75", "40", PREEMPTED, True),  # a preempted run checkpointed: always requeued
        # SIGTERM to all of each task: the per-task shell outlives it and reports train's 75.
        ("term term", "", PREEMPTED, True),
    ],
)
def test_slurm_sbatch_requeues_preempted_and_stalled_runs(tmp_path, tasks, restarts, want,
                                                          requeued):  # fmt: skip
    """The batch script with a stand-in srun that runs each task's command (a stand-in python
    exits with that task's status, or srun kills the task first: "kill") and returns the highest
    status, as srun does, and a stand-in scontrol: requeue on 75 (preempted, checkpointed) and on
    124 (stalled: the watchdog's exit) or a mix of them with killed peers, the latter bounded by
    SLURM_RESTART_COUNT; the script's status is the run's."""
    calls = tmp_path / "calls"
    calls.write_text("")
    srun = f"""
        args="$*"; echo "srun ${{args//$'\n'/ }}" >> {calls}
        while [[ $1 == -* ]]; do shift; done
        status=0; id=0
        for task in $TASKS; do
          if [[ $task == kill ]]; then code={KILLED}
          elif [[ $task == term ]]; then  # SLURM's SIGTERM to every process of the task
            SLURM_PROCID=$id TASK_STATUS=75 WAIT_FOR_TERM=1 setsid "$@" &
            pid=$!; sleep 1; kill -TERM -- -$pid; wait $pid; code=$?
          else SLURM_PROCID=$id TASK_STATUS=$task "$@"; code=$?; fi
          ((code > status)) && status=$code
          id=$((id + 1))
        done
        exit $status"""
    # train's orderly stop on SIGTERM: checkpoint, exit 75.
    python = f"""
        trap 'exit $TASK_STATUS' TERM
        printf "%s|" "$@" > {tmp_path}/argv_$SLURM_PROCID
        [[ -z ${{WAIT_FOR_TERM:-}} ]] || {{ sleep 20 & wait; }}
        exit $TASK_STATUS"""
    env = stand_ins(tmp_path, srun=srun, python=python, scontrol=f'echo "scontrol $*" >> {calls}')
    env = dict(env, SLURM_JOB_ID="123", TASKS=tasks)
    if restarts:
        env["SLURM_RESTART_COUNT"] = restarts
    workdir = tmp_path / "shared runs" / "caliber"  # a space: one argument all the way
    result = subprocess.run(
        ["bash", str(LAUNCH / "slurm.sbatch"), "configs/caliber.py", str(workdir),
         "--config.loss.lam=0.5"],
        capture_output=True, text=True, env=env, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == want, result.stdout + result.stderr
    logged = calls.read_text().splitlines()
    assert logged[0].startswith("srun ") and "caliber_jax.train" in logged[0]
    assert logged[1:] == (["scontrol requeue 123"] if requeued else []), result.stderr
    if want == STALLED and not requeued:
        assert "not requeueing (MAX_STALL_REQUEUES=3)" in result.stderr
    if tasks[0] != "k":
        argv = (tmp_path / "argv_0").read_text()
        assert argv == (f"-m|caliber_jax.train|--config|configs/caliber.py|--workdir|{workdir}|"
                        "--config.multihost=True|--config.loss.lam=0.5|")  # fmt: skip


def test_slurm_sbatch_refuses_a_bad_requeue_bound(tmp_path):
    env = dict(stand_ins(tmp_path, srun="exit 0"), MAX_STALL_REQUEUES="three")
    result = subprocess.run(
        ["bash", str(LAUNCH / "slurm.sbatch"), "configs/caliber.py", str(tmp_path / "run")],
        capture_output=True, text=True, env=env, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "slurm.sbatch: MAX_STALL_REQUEUES=three: not a count"
    ]


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


def test_tpu_pod_passes_every_argument_to_the_workers_intact(tmp_path):
    """Arguments and paths with spaces, quotes and `$` reach `train` on each worker as they were
    given: a stand-in gcloud runs the `--command` string with bash, as the worker's shell does."""
    home = tmp_path / "worker home"
    (home / "caliber_jax").mkdir(parents=True)
    gcloud = f"""
        printf "%s\\n" "$@" > {tmp_path}/gcloud_argv
        while [[ $1 != --command ]]; do shift; done
        cd "{home}" && bash -c "$2"
        """
    python = f'printf "%s\\n" "$@" > {tmp_path}/python_argv; exit 0'
    env = stand_ins(tmp_path, gcloud=gcloud, python=python)
    given = ["my tpu", "us-central2-b", "configs/my config.py", "gs://b/runs/it's $HOME",
             "--config.data.dir=/data/two  spaces", '--config.note=say "hi"; exit 3']  # fmt: skip
    result = subprocess.run(
        ["bash", str(LAUNCH / "tpu_pod.sh"), *given],
        capture_output=True, text=True, env=env, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    gcloud_argv = (tmp_path / "gcloud_argv").read_text().splitlines()
    assert gcloud_argv[:6] == ["compute", "tpus", "tpu-vm", "ssh", "my tpu", "--zone"]
    assert (tmp_path / "python_argv").read_text().splitlines() == [
        "-m", "caliber_jax.train", "--config", "configs/my config.py", "--workdir",
        "gs://b/runs/it's $HOME", "--config.multihost=True", "--config.data.dir=/data/two  spaces",
        '--config.note=say "hi"; exit 3',
    ]  # fmt: skip
    assert "caliber_jax exit status 0" in result.stdout
