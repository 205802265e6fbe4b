"""A step watchdog: a run whose steps stop completing dumps every thread's stack and exits.

A deadlocked collective leaves every process alive, asleep and silent, and a scheduler waits
for it forever. Each process runs one `StepWatchdog`; when no step completes within
`factor` times the slowest step so far (a step that compiles counts with its compile time), or
`min_seconds` if that is longer, it writes a faulthandler dump of all threads to stderr and exits
with `EXIT_STALLED`, which a scheduler can requeue (the last checkpoint is kept). Before the first
step ends, and during validation or a checkpoint save (`phase`), whose durations no step
predicts, the limit is `factor` x `min_seconds`.
"""

import contextlib
import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable

# No step completed in time (GNU timeout's status for "timed out"); distinct from 1 (an error)
# and 75 (preempted, checkpointed). The last checkpoint is kept: the same command resumes.
EXIT_STALLED = 124


class StepWatchdog:
    """Call `step_done(step)` after every step; the watchdog thread ends the process on a stall.

    Args:
      factor: a stall is `factor` x the slowest step so far; 0 turns the watchdog off.
      min_seconds: never a shorter limit than this; `factor` x this before the first step ends
        and during a `phase`.
      clock: seconds, monotonic (tests pass a fake one).
      poll_seconds: how often the thread looks.
      grace_seconds: after the dump, wait this long before exiting (None: a tenth of the limit,
        at least 5 s), so the other processes of a run, stalled at the same step with limits of
        their own, dump too before a launcher that stops every process on the first failure
        kills them.
      exit_fn: ends the process (tests replace it); `os._exit`, since a stalled main thread
        never returns to run `sys.exit`'s cleanup.
    """

    def __init__(
        self,
        *,
        factor: float,
        min_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        poll_seconds: float = 1.0,
        grace_seconds: float | None = None,
        exit_fn: Callable[[int], None] = os._exit,
    ):
        if factor < 0 or min_seconds <= 0:
            raise ValueError(
                f"watchdog_factor={factor} must be >= 0 (0 = off), watchdog_min_s={min_seconds} > 0"
            )
        self.factor = factor
        self.min_seconds = min_seconds
        self._clock = clock
        self._poll = poll_seconds
        self._grace = grace_seconds
        self._exit = exit_fn
        self._lock = threading.Lock()
        self._last = clock()
        self._slowest = 0.0
        self._step: int | None = None
        self._phase: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def limit(self) -> float:
        """Seconds the current step (or phase) may take."""
        with self._lock:
            if self._step is None or self._phase is not None:
                return self.factor * self.min_seconds
            return max(self.min_seconds, self.factor * self._slowest)

    @contextlib.contextmanager
    def phase(self, name: str):
        """Work between steps whose duration no step predicts (validation, a checkpoint save):
        watched with the long limit, and not counted as a step."""
        with self._lock:
            self._phase, self._last = name, self._clock()
        try:
            yield
        finally:
            with self._lock:
                self._phase, self._last = None, self._clock()

    def step_done(self, step_num: int) -> None:
        """Step `step_num` completed: the next one's limit starts now."""
        now = self._clock()
        with self._lock:
            self._slowest = max(self._slowest, now - self._last)
            self._last = now
            self._step = step_num

    def start(self) -> "StepWatchdog":
        if self.factor > 0:
            with self._lock:
                self._last = self._clock()
            self._thread = threading.Thread(target=self._watch, name="step-watchdog", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def stalled(self) -> bool:
        """Whether the current step has run past its limit."""
        limit = self.limit()
        with self._lock:
            return self._clock() - self._last > limit

    def _watch(self) -> None:
        while not self._stop.wait(self._poll):
            if self.stalled():
                self._fire()
                return

    def _fire(self) -> None:
        with self._lock:
            waited, step_num, slowest = self._clock() - self._last, self._step, self._slowest
            where = f"in {self._phase}" if self._phase else "without a step completing"
        after = "the start" if step_num is None else f"step {step_num}"
        print(
            f"[caliber_jax] watchdog: {waited:.0f} s {where} after {after} (limit "
            f"{self.limit():.0f} s from watchdog_factor={self.factor}, "
            f"watchdog_min_s={self.min_seconds}, slowest step {slowest:.1f} s); "
            f"every thread's stack follows; exiting with {EXIT_STALLED}",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        grace = self._grace if self._grace is not None else max(5.0, 0.1 * self.limit())
        if self._stop.wait(grace):
            return  # the run ended during the grace period after all
        self._exit(EXIT_STALLED)
