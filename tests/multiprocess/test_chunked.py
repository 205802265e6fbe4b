"""The demo config's own step with 2 processes x 2 CPU devices: packed rows, chunked gradients,
against 1 process x 4 devices (the packed layout's multi-process parity).

Issue #34: this deadlocked within a few steps (every thread of both processes asleep, the
launcher waiting forever). Only the data, the step count and the depth differ from
configs/demo.py: the 64 training passages pack into 20 or 24 rows per process, so each step runs 5
or 6 groups of 4 rows, and 8 steps meet each row count 4 times. One of the demo's 3 layers: the
step's programs and collectives are the same at any depth (the hang was in their order, not in
the layers), and each layer cost ~25 s of the suite's wall time on 2 cores. The launch's timeout
turns a hang into a failure with every process's stacks in the message
(conftest.Launch.dump_stacks).
"""

import json

import pytest

from tests.conftest import relative_gaps, step_metrics
from tests.multiprocess.conftest import flat_params, launch, max_abs_diff, module

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow(80)]
STEPS = 8


def demo_command(data_dir, workdir) -> list[str]:
    """configs/demo.py on the test data, for STEPS steps, at one layer."""
    return module("caliber_jax.train", f"--config.data.dir={data_dir}", f"--workdir={workdir}",
                  f"--config.total_steps={STEPS}", "--config.model.num_layers=1")  # fmt: skip


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("chunked")
    started = {}
    # Side by side, as tests/multiprocess/test_train.py's runs: the single-threaded parts of one
    # (imports, tracing, compiling) leave a core to the other.
    for processes, devices in ((2, 2), (1, 4)):
        workdir = root / f"{processes}x{devices}"
        started[processes] = (
            workdir,
            launch(
                processes,
                *demo_command(data_dir, workdir),
                devices=devices,
                log=root / f"{workdir.name}.log",
            ),
        )
    done = {}
    for processes, (workdir, run) in started.items():
        run.check()
        done[processes] = workdir, run.output()
    return done


def test_the_demo_step_finishes_with_two_processes(runs):
    workdir, output = runs[2]
    assert "step=chunked (groups of 4 rows)" in output and "in_order=True" in output
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["step"] == summary["steps_run"] == STEPS
    logged = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logged if "train/loss" in row] == [5, 8]  # log_every = 5
    _, step = flat_params(workdir)
    assert step == STEPS


def test_two_processes_match_one_with_chunked_gradients(runs):
    # The gradients first, at the logged steps (every 5th: more frequent logging would wait for
    # each step, which hid the deadlock): the loss and the gradient's global norm, relative. A row
    # lost or counted twice moves them by O(1/rows), a gradient scaled by c moves the norm by c
    # (which Adam divides out of the parameters below).
    logs = {processes: step_metrics(runs[processes][0]) for processes in (2, 1)}
    assert [row["step"] for row in logs[1]] == [5, 8]
    for key in ("train/grad_norm", "train/loss"):
        gaps = relative_gaps(logs[2], logs[1], key)
        print(f"demo step, chunked: {key} relative gaps {[f'{gap:.2g}' for gap in gaps]}")
        assert max(gaps) <= 1e-5, (key, gaps)
    two, _ = flat_params(runs[2][0])
    one, _ = flat_params(runs[1][0])
    assert "in_order=True" in runs[1][1]  # 1 x 4 deadlocked as well without it
    diff = max_abs_diff(two, one)
    print(f"demo step, chunked: max |2x2 - 1x4| over all params after {STEPS} steps = {diff:.3g}")
    # Each process groups its own rows, so the two runs add the same row gradients in another
    # order (the bound of test_train.py's packed parity); a row lost or counted twice moves
    # params by ~lr = 5e-4.
    assert diff <= 5e-5
