"""caliber_jax/compile_ahead.py: step programs compiled on a background thread."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caliber_jax import compile_ahead


class CountingJit:
    """A jitted step (state, batch) -> state + sum(batch) that counts its lowerings; lowering
    `hold_rows` rows waits for `release`."""

    def __init__(self, fail_rows: int | None = None, hold_rows: int | None = None):
        self.jitted = jax.jit(lambda state, batch: state + jnp.sum(batch["x"]))
        self.lowered: list[tuple] = []
        self.fail_rows = fail_rows
        self.hold_rows = hold_rows
        self.release = threading.Event()
        self.lock = threading.Lock()

    def lower(self, state, batch):
        with self.lock:
            self.lowered.append(batch["x"].shape)
        if batch["x"].shape[0] == self.hold_rows:
            assert self.release.wait(timeout=60)
        if batch["x"].shape[0] == self.fail_rows:
            raise ValueError(f"cannot lower {self.fail_rows} rows")
        return self.jitted.lower(state, batch)


def batch(rows: int) -> dict[str, np.ndarray]:
    return {"x": np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)}


def test_results_equal_jit_and_each_shape_compiles_once():
    step = CountingJit()
    programs = compile_ahead.StepPrograms(step)
    state = jnp.float32(0)
    for rows in (2, 4, 2, 4, 6):
        expected = step.jitted(state, batch(rows))
        state = programs(state, batch(rows))
        np.testing.assert_array_equal(state, expected)
    assert sorted(step.lowered) == [(2, 3), (4, 3), (6, 3)]


def test_the_walk_builds_coming_shapes_before_their_steps():
    step = CountingJit()
    programs = compile_ahead.StepPrograms(step)
    schedule = [2, 2, 4, 2, 8, 4]  # rows per coming step
    programs.start(((rows, rows) for rows in schedule),
                   lambda rows: (jnp.float32(0), batch(rows)))  # fmt: skip
    programs._thread.join(timeout=60)  # the walk ends after the schedule's three shapes
    assert programs.compiled_ahead == 3 and sorted(step.lowered) == [(2, 3), (4, 3), (8, 3)]
    state = jnp.float32(0)
    for rows in schedule:
        state = programs(state, batch(rows))
    assert len(step.lowered) == 3  # the steps reused the walk's programs
    # Each build's seconds, one per program (train logs the first and the longest).
    assert len(programs.build_seconds) == 3 and all(s > 0 for s in programs.build_seconds)
    assert float(state) == sum(float(batch(rows)["x"].sum()) for rows in schedule)
    programs.close()


def test_the_first_steps_program_compiles_alone():
    # The first step asks for its program before the walk gets to it: the walk waits for that
    # build to end before it compiles the next shape.
    step = CountingJit(hold_rows=2)
    programs = compile_ahead.StepPrograms(step)
    first = threading.Thread(target=programs, args=(jnp.float32(0), batch(2)))
    first.start()
    while not step.lowered:
        time.sleep(0.01)
    programs.start(((rows, rows) for rows in (2, 4)), lambda rows: (jnp.float32(0), batch(rows)))
    time.sleep(0.5)
    try:
        assert step.lowered == [(2, 3)]  # the second shape waits
    finally:
        step.release.set()
    first.join(timeout=60)
    programs._thread.join(timeout=60)
    assert step.lowered == [(2, 3), (4, 3)] and programs.compiled_ahead == 1
    programs.close()


def test_a_failed_build_raises_in_the_step_that_needs_it():
    step = CountingJit(fail_rows=4)
    programs = compile_ahead.StepPrograms(step)
    programs.start(((rows, rows) for rows in (2, 4)), lambda rows: (jnp.float32(0), batch(rows)))
    programs.close()
    assert programs(jnp.float32(0), batch(2)) == batch(2)["x"].sum()
    with pytest.raises(ValueError, match="cannot lower 4 rows"):
        programs(jnp.float32(0), batch(4))


def test_close_stops_the_walk():
    step = CountingJit()
    programs = compile_ahead.StepPrograms(step)
    release = threading.Event()

    def walk():
        yield 2, 2
        release.wait(timeout=60)
        yield 4, 4

    programs.start(walk(), lambda rows: (jnp.float32(0), batch(rows)))
    programs._stop.set()
    release.set()
    programs.close()
    assert step.lowered == [(2, 3)]


@pytest.mark.parametrize("parallel", [1, 2])
def test_later_shapes_build_side_by_side(parallel):
    """After the first step's program, `parallel` shapes build at once: with 2, the third shape
    lowers while the second is still held; with 1, it waits for it."""
    step = CountingJit(hold_rows=4)
    programs = compile_ahead.StepPrograms(step)
    programs.start(((rows, rows) for rows in (2, 4, 8)),
                   lambda rows: (jnp.float32(0), batch(rows)), parallel=parallel)  # fmt: skip
    deadline = time.monotonic() + (30 if parallel == 2 else 2)
    while len(step.lowered) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        held = sorted(step.lowered)
    finally:
        step.release.set()
    programs._thread.join(timeout=60)
    assert held == ([(2, 3), (4, 3), (8, 3)] if parallel == 2 else [(2, 3), (4, 3)])
    assert programs.compiled_ahead == 3
    programs.close()
