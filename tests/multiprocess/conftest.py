"""Multi-process fixtures: tiny prepared data with teacher vectors, and a launcher handle.

Every run goes through `launch/local_multiprocess.sh` (2 JAX processes x 2 CPU devices, gloo
collectives on localhost), as users run it. Each wait has a timeout that kills the whole process
group, so a deadlock fails the test instead of hanging CI; before that, every process writes the
stacks of all its threads into the log (faulthandler, on SIGABRT).
"""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from caliber_jax import checkpoint
from tests.conftest import prepare_sample, with_opt_level

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "launch" / "local_multiprocess.sh"
DEMO = f"--config={REPO / 'configs' / 'demo.py'}"
TIMEOUT_S = 420  # per launch; a healthy one takes well under a minute on 2 busy cores
# Tiny runs: 1 layer of all-MiniLM-L6-v2, batch 8 (2 rows per device), 6 steps.
LR = 1e-3
TINY = [
    "--config.model.num_layers=1",
    "--config.data.max_length=48",
    "--config.batch_size=8",
    "--config.total_steps=6",
    "--config.checkpoint_every=2",
    "--config.eval_every=6",
    "--config.log_every=1",
    f"--config.optim.lr={LR}",
    "--config.data.pack_length=48",  # packed rows as long as the longest sequence
]
EMBED = ["--config.teacher.max_length=48", "--config.teacher.chunk_rows=16"]


class Launch:
    """One `local_multiprocess.sh` run in its own process group; output goes to `log`."""

    def __init__(self, num: int, *command: str, devices: int, log: Path,
                 opt_level: int | None = None):  # fmt: skip
        self.log = log
        # PYTHONFAULTHANDLER: a SIGABRT (`dump_stacks`) writes every thread's Python stack.
        env = dict(os.environ, LOCAL_DEVICES=str(devices), PYTHONUNBUFFERED="1",
                   PYTHONFAULTHANDLER="1")  # fmt: skip
        if opt_level is not None:  # XLA's LLVM level, as in the tests' own process
            env["XLA_FLAGS"] = with_opt_level(env.get("XLA_FLAGS"), opt_level)
        with open(log, "w") as handle:
            self.proc = subprocess.Popen(
                ["bash", str(LAUNCHER), str(num), "--", *command],
                cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def pids(self) -> dict[int, int]:
        """JAX process index -> pid, as the launcher announces them."""
        found = re.findall(r"local_multiprocess: process (\d+) pid (\d+)", self.output())
        return {int(index): int(pid) for index, pid in found}

    def wait(self, timeout: float = TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.dump_stacks()
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(
                f"timed out after {timeout} s (deadlock?); stacks of every process:\n"
                f"{self.tail(30000)}"
            ) from None

    def dump_stacks(self) -> None:
        """Every process writes all its threads' stacks into the log (faulthandler on SIGABRT).
        The launcher is stopped first: it would kill the others when the first one dies."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        for pid in self.pids().values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGABRT)
        time.sleep(3)

    def check(self, timeout: float = TIMEOUT_S) -> None:
        code = self.wait(timeout)
        assert code == 0, f"exit {code}:\n{self.tail()}"

    def tail(self, chars: int = 4000) -> str:
        return self.output()[-chars:]


def launch(num: int, *command: str, devices: int = 2, log: Path,
           opt_level: int | None = None) -> Launch:  # fmt: skip
    """`command` in `num` processes of `devices` CPU devices each; `opt_level`: XLA's LLVM
    optimisation level for them (default: XLA's, as users run the entry points)."""
    return Launch(num, *command, devices=devices, log=log, opt_level=opt_level)


def module(name: str, *args: str) -> list[str]:
    return [sys.executable, "-m", name, DEMO, *args]


def train_command(data_dir, workdir, *extra: str) -> list[str]:
    return module("caliber_jax.train", f"--config.data.dir={data_dir}", f"--workdir={workdir}",
                  *TINY, *extra)  # fmt: skip


def wait_for(predicate, run: Launch, timeout: float = TIMEOUT_S) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert run.proc.poll() is None, f"ended early:\n{run.tail()}"
        if time.time() > deadline:
            os.killpg(run.proc.pid, signal.SIGKILL)
            raise AssertionError(f"timed out waiting:\n{run.tail()}")
        time.sleep(0.2)


def flat_params(workdir) -> tuple[dict[str, np.ndarray], int]:
    params, step = checkpoint.restore_params(Path(workdir) / "checkpoints")
    return flatten(params), step


def flatten(tree, prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = np.asarray(value)
    return out


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory) -> Path:
    """64 training and 16 validation passages of the bundled filings (no teacher vectors)."""
    return prepare_sample(tmp_path_factory.mktemp("prepared"))


@pytest.fixture(scope="session")
def data_dir(teacher_data_dir) -> Path:
    """The prepared passages with single-process all-MiniLM-L6-v2 teacher stores (`EMBED`'s
    settings), the same directory as tests/test_train.py's (built once per session)."""
    assert EMBED == ["--config.teacher.max_length=48", "--config.teacher.chunk_rows=16"]
    return teacher_data_dir
