"""compile_ahead: the walk ends once every shape has come, and closing after a failure drops
the queued builds and waits for none."""

import time

import jax.numpy as jnp

from caliber_jax import compile_ahead
from tests.test_compile_ahead import CountingJit, batch


def test_the_walk_ends_once_every_kind_has_come():
    """A run's shapes are the ladder's few rungs: the walk plans steps only until each has come,
    not every step of the run (30 epochs of LEAF were all planned on the walk's thread)."""
    planned = []

    def kind_fn(step):
        planned.append(step)
        return (2, 4, 2, 8, 4)[step] if step < 5 else 2

    walk = compile_ahead.first_of_each(kind_fn, range(1_000_000), kinds=3)
    assert list(walk) == [(2, 0), (4, 1), (8, 3)]
    assert planned == [0, 1, 2, 3]


def _held_run(parallel=1):
    """Programs whose walk built 2 rows, is building 4 (held) and has queued 8 and 16."""
    step = CountingJit(hold_rows=4)
    programs = compile_ahead.StepPrograms(step)
    programs.start(((rows, rows) for rows in (2, 4, 8, 16)),
                   lambda rows: (jnp.float32(0), batch(rows)), parallel=parallel)  # fmt: skip
    deadline = time.monotonic() + 60
    while (4, 3) not in step.lowered and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sorted(step.lowered) == [(2, 3), (4, 3)]
    return step, programs


def test_closing_after_a_failure_waits_for_no_build():
    """Training failed: close returns at once, with a build still in progress (a GPU compile
    can take minutes), and the queued ones never start."""
    step, programs = _held_run()
    started = time.monotonic()
    programs.close(wait=False)
    assert time.monotonic() - started < 1.0
    step.release.set()
    programs._thread.join(timeout=60)
    assert sorted(step.lowered) == [(2, 3), (4, 3)]
