"""Compile a run's train-step programs ahead of the steps that need them.

Every distinct batch shape is its own XLA program, and compiling one takes seconds on a CPU (and
minutes for a large model on a GPU), during which jit leaves the step waiting and, on a small
CPU, a core idle. The loader's batch for a step is a pure function of the step, and its shape is
a function of token lengths only (`pipeline.make_batch_fn(...).geometry`), so a background thread
walks the coming steps (until each of the row ladder's counts has come: `first_of_each`), and for
each new shape builds that step's batch once and lowers and compiles the step for it while the
training thread runs the steps before. The executables are
the ones `jax.jit` would build (same function, shardings and donation, same persistent cache);
a step whose shape is not ready yet waits for it, or compiles it itself if the walk has not got
there. The first step's program is built alone (by the walk, or by that step if it asks first):
the launch waits for it, and nothing else competes with it. The later shapes (the packed
layout's few row counts) are then built `parallel` at a time, on the host's free cores.
"""

import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent import futures
from typing import Any

from absl import logging

ShapeKey = tuple


def shape_key(batch: dict[str, Any]) -> ShapeKey:
    """What decides the program a batch runs: each array's name, shape and dtype."""
    return tuple((name, tuple(v.shape), str(v.dtype)) for name, v in sorted(batch.items()))


def first_of_each(
    kind_fn: Callable[[int], Hashable], steps: Iterable[int], *, kinds: int
) -> Iterator[tuple[Hashable, int]]:
    """(kind, step) for the first of `steps` of each kind (`kind_fn(step)`, e.g. a batch
    function's `geometry`), ending once `kinds` kinds have come: a run's shapes are the row
    ladder's few rungs, so the walk need not plan every later step of the run."""
    seen = set()
    for step in steps:
        kind = kind_fn(step)
        if kind not in seen:
            seen.add(kind)
            yield kind, step
            if len(seen) >= kinds:
                return


class StepPrograms:
    """`programs(state, batch, *rest)` runs `jitted(state, batch, *rest)` through an executable
    compiled for its batch's shape (`shape_key`); `jitted` is the `jax.jit` step function."""

    def __init__(self, jitted: Callable):
        self._jitted = jitted
        self._programs: dict[ShapeKey, futures.Future] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: futures.ThreadPoolExecutor | None = None
        self._queued: dict[futures.Future, futures.Future] = {}  # program -> its queued build
        self.compiled_ahead = 0  # programs the background walk built (for tests and logs)
        # Seconds each program took to build (lower + compile, or a persistent-cache load), in
        # the order they finished: the first is the first step's, built alone.
        self.build_seconds: list[float] = []

    def __call__(self, *args):
        key = shape_key(args[1])
        future, mine = self._claim(key)
        if mine:
            self._build(future, args)
        return future.result()(*args)

    def start(
        self,
        walk: Iterable[tuple[Hashable, Any]],
        make_args: Callable[[Any], tuple],
        *,
        parallel: int = 1,
    ):
        """Compiles ahead on a background thread.

        Args:
          walk: (kind, item) per coming step, in order; equal kinds mean equal batch shapes (e.g.
            `geometry(step)`), and only the first item of each kind is built, via `make_args`.
          make_args: item -> the step's call arguments, as the training loop will pass them.
          parallel: programs built at once after the first one (>= 1): XLA compiles a program
            on one thread, so a host with free cores builds the later shapes side by side.
        """
        if self._thread is not None:
            raise RuntimeError("StepPrograms.start: already started")
        if parallel < 1:
            raise ValueError(f"parallel={parallel}: must be >= 1")

        def build(future: futures.Future, args: tuple) -> None:
            self._build(future, args)
            with self._lock:
                self.compiled_ahead += 1

        self._pool = futures.ThreadPoolExecutor(parallel, thread_name_prefix="compile-ahead")

        def run() -> None:
            seen, submitted = set(), []
            try:
                for kind, item in walk:
                    if self._stop.is_set():
                        return
                    if kind in seen:
                        continue
                    seen.add(kind)
                    args = make_args(item)
                    future, mine = self._claim(shape_key(args[1]))
                    if mine:
                        with self._lock:
                            try:
                                self._queued[future] = self._pool.submit(build, future, args)
                            except RuntimeError:  # closed after a failure: nothing is queued
                                future.set_exception(futures.CancelledError())
                                return
                            submitted.append(future)
                    if len(seen) == 1:
                        # The first step waits for its program alone: until it is built (here
                        # or by that step), nothing else compiles beside it for the cores, the
                        # GIL or, on a GPU, the autotuner's timing runs.
                        futures.wait([future])
            except Exception as error:  # the steps still compile, when they come
                logging.warning("compile-ahead stopped: %s", error)
            finally:
                # The thread ends with its builds: each built, failed or dropped by `close`.
                futures.wait(submitted)

        self._thread = threading.Thread(target=run, name="compile-ahead", daemon=True)
        self._thread.start()

    def close(self, *, wait: bool = True) -> None:
        """Stops the walk. `wait`: after the builds it queued (so no compile outlives training);
        False (training failed): drops the builds not started and returns at once, leaving those
        in progress to end on their daemon threads."""
        self._stop.set()
        if not wait:
            with self._lock:
                if self._pool is not None:
                    self._pool.shutdown(wait=False, cancel_futures=True)
                for future, build in self._queued.items():
                    if build.cancelled():  # never started: no step will ask for it any more
                        future.set_exception(futures.CancelledError())
            return
        if self._thread is not None:
            self._thread.join()  # it ends with its builds
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _claim(self, key: ShapeKey) -> tuple[futures.Future, bool]:
        """The future of `key`'s program, and whether the caller must build it."""
        with self._lock:
            future = self._programs.get(key)
            if future is not None:
                return future, False
            future = self._programs[key] = futures.Future()
            return future, True

    def _build(self, future: futures.Future, args: tuple) -> None:
        start = time.perf_counter()
        try:
            program = self._jitted.lower(*args).compile()
        except BaseException as error:  # the step that needs this program raises it
            future.set_exception(error)
            return
        with self._lock:
            self.build_seconds.append(time.perf_counter() - start)
        future.set_result(program)
