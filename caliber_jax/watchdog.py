"""A step watchdog: a run whose steps stop completing dumps every thread's stack and exits; and
`SigtermFlag`, the stop a preemption or a Ctrl-C asks for, at a step every process agrees on.

A deadlocked collective leaves every process alive, asleep and silent, and a scheduler waits
for it forever. Each process runs one `StepWatchdog`, from the top of `train()` to its very end.
When no step completes within `factor` times the slowest step so far (a step that compiles counts
with its compile time), or `min_seconds` if that is longer, it writes a faulthandler dump of all
threads to stderr; if nothing progresses in the grace period that follows (no step completes, no
phase begins or ends), it exits with `EXIT_STALLED`, which a scheduler can requeue (the last
checkpoint is kept). Work whose duration no step predicts has the limit `factor` x `min_seconds`:
start-up (until the first step completes), a step whose batch shape is new (its program compiles,
or compile-ahead's may still be compiling), validation, a checkpoint save, and closing (joining
the compile thread, waiting for the last save).
"""

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# No step completed in time (GNU timeout's status for "timed out"); distinct from 1 (an error)
# and 75 (preempted, checkpointed). The last checkpoint is kept: the same command resumes.
EXIT_STALLED = 124
# sysexits.h EX_TEMPFAIL: stopped by SIGTERM (preemption) or one Ctrl-C with a checkpoint; rerun
# to resume.
EXIT_PREEMPTED = 75


class StepWatchdog:
    """Call `step_done(step)` after every step; the watchdog thread ends the process on a stall.

    It starts in the phase "start-up", which lasts until the first step completes. `enter(name)`
    begins a phase that lasts until the next step completes (a step that compiles, closing);
    `phase(name)` is a block between steps (validation, a checkpoint save).

    Args:
      factor: a stall is `factor` x the slowest step so far; 0 turns the watchdog off.
      min_seconds: never a shorter limit than this; `factor` x this in every phase.
      clock: seconds, monotonic (tests pass a fake one).
      poll_seconds: how often the thread looks (`check`).
      grace_seconds: after the dump, wait this long for progress before exiting (None: a tenth
        of the limit, at least 5 s), so that a slow step which completes after all does not end
        the run, and the other processes of a run, stalled at the same step with limits of their
        own, dump too before a launcher that stops every process on the first failure kills them.
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
        self._step_phase: str | None = "start-up"  # until the next step completes
        self._phase: str | None = None  # a `phase` block
        # Counts completed steps and phase changes: a dump followed by progress is no stall.
        self._progress = 0
        # After a dump: (progress, exit time, step) at the dump.
        self._dumped: tuple[int, float, int | None] | None = None
        self._exited = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _current_limit(self) -> float:
        if self._phase is not None or self._step_phase is not None:
            return self.factor * self.min_seconds
        return max(self.min_seconds, self.factor * self._slowest)

    def limit(self) -> float:
        """Seconds the current step (or phase) may take."""
        with self._lock:
            return self._current_limit()

    def enter(self, name: str) -> None:
        """Phase `name` runs from now until the next step completes: the long limit, timed from
        now (a step whose batch shape is new: "compile"; the end of a run: "closing")."""
        with self._lock:
            self._step_phase, self._last = name, self._clock()
            self._progress += 1

    @contextlib.contextmanager
    def phase(self, name: str):
        """Work between steps whose duration no step predicts (validation, a checkpoint save):
        watched with the long limit, and not counted as a step."""
        with self._lock:
            previous = self._phase
            self._phase, self._last = name, self._clock()
            self._progress += 1
        try:
            yield
        finally:
            with self._lock:
                self._phase, self._last = previous, self._clock()
                self._progress += 1

    def step_done(self, step_num: int) -> None:
        """Step `step_num` completed: the next one's limit starts now."""
        now = self._clock()
        with self._lock:
            self._slowest = max(self._slowest, now - self._last)
            self._last = now
            self._step = step_num
            self._step_phase = None
            self._progress += 1

    def start(self) -> "StepWatchdog":
        """Starts the watching thread (none when `factor` is 0); start-up is timed from now."""
        if self.factor > 0:
            with self._lock:
                self._last = self._clock()
            self._thread = threading.Thread(target=self._watch, name="step-watchdog", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stops watching, also in a grace period after a dump (the run ended after all)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def stalled(self) -> bool:
        """Whether the current step (or phase) has run past its limit."""
        with self._lock:
            return self._clock() - self._last > self._current_limit()

    def check(self) -> None:
        """One look (the thread's, every `poll_seconds`): on a stall, dump every thread's stack;
        once a dump's grace period has passed with no progress, exit with `EXIT_STALLED`; on
        progress after a dump, say so and watch on."""
        with self._lock:
            now, progress = self._clock(), self._progress
            if self._dumped is not None:
                dumped_progress, exit_at, dumped_step = self._dumped
                if progress == dumped_progress:
                    if now >= exit_at:
                        self._exited = True
                        self._exit(EXIT_STALLED)
                    return
                self._dumped = None
                phase = self._phase or self._step_phase
                resumed = (f"step {self._step} completed" if self._step != dumped_step
                           else f"now in {phase}" if phase else "a phase ended")  # fmt: skip
                _say(f"watchdog: progress after the dump ({resumed}); not exiting")
            limit, waited = self._current_limit(), now - self._last
            if waited <= limit:
                return
            grace = self._grace if self._grace is not None else max(5.0, 0.1 * limit)
            self._dumped = (progress, now + grace, self._step)
            phase = self._phase or self._step_phase
            where = f"in {phase}" if phase else "without a step completing"
            after = "before the first step" if self._step is None else f"after step {self._step}"
            slowest = self._slowest
        _say(
            f"watchdog: {waited:.0f} s {where} {after} (limit {limit:.0f} s from "
            f"watchdog_factor={self.factor}, watchdog_min_s={self.min_seconds}, slowest step "
            f"{slowest:.1f} s); every thread's stack follows; exiting with {EXIT_STALLED} unless "
            f"a step completes or a phase begins or ends within {grace:.0f} s"
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()

    def _watch(self) -> None:
        # Ends on `close` (also in a grace period: the run ended after all) or after the exit.
        while not self._stop.wait(self._poll) and not self._exited:
            self.check()


class SigtermFlag:
    """SIGTERM (preemption) -> checkpoint and stop, at the same step on every process.

    One process (`agreed_fn` None): a Python handler sets a flag; Ctrl-C (SIGINT) does the same,
    and a second Ctrl-C stops at once (KeyboardInterrupt, the steps since the last checkpoint
    lost). Several: JAX's preemption service (started by `jax.distributed.initialize`) catches
    SIGTERM on any process, spreads it through the coordinator, and `agreed_fn(step)`
    (`multihost_utils.reached_preemption_sync_point`) turns True at one agreed step everywhere,
    so no process enters Orbax's collective save while another runs the next train step. No
    device collective is involved; it must be asked at every step. `install` sets the handlers
    and `restore` puts back those they replaced (a caller of `train()` keeps its own Ctrl-C).
    """

    def __init__(self, agreed_fn: Callable[[int], bool] | None = None):
        self.raised = False
        self.signum = signal.SIGTERM  # what raised it (JAX's service: SIGTERM)
        self._agreed_fn = agreed_fn
        self._replaced: dict[int, Any] = {}

    def install(self) -> "SigtermFlag":
        """From now on SIGTERM and SIGINT set the flag (one process; several: JAX's service)."""
        if self._agreed_fn is None and not self._replaced:
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._replaced[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        """The handlers `install` replaced are back."""
        for signum, handler in self._replaced.items():
            signal.signal(signum, handler)
        self._replaced.clear()

    def _handle(self, signum, frame):
        del frame
        self.raised = True
        self.signum = signum
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # the second one stops now
            print("\n[caliber_jax] Ctrl-C: saving a checkpoint after this step and stopping "
                  "(Ctrl-C again stops at once)", file=sys.stderr, flush=True)  # fmt: skip

    def reached(self, step_num: int) -> bool:
        """Whether to checkpoint and stop after `step_num` (call once per step, in order)."""
        if self._agreed_fn is not None:
            self.raised = self._agreed_fn(step_num)
        return self.raised


def _say(line: str) -> None:
    print(f"[caliber_jax] {line}", file=sys.stderr, flush=True)
