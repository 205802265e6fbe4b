"""caliber_jax/watchdog.py: a stalled run dumps every thread and exits with EXIT_STALLED."""

import subprocess
import sys
import textwrap
import time

import pytest

from caliber_jax import watchdog


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_limit_follows_the_slowest_step_and_phases_get_the_long_limit():
    clock = FakeClock()
    dog = watchdog.StepWatchdog(factor=4.0, min_seconds=10.0, clock=clock)
    assert dog.limit() == 40.0  # before the first step: factor x min_seconds
    clock.now += 30.0  # the first step, compile included
    dog.step_done(1)
    assert dog.limit() == 120.0  # 4 x 30
    clock.now += 1.0
    dog.step_done(2)
    assert dog.limit() == 120.0  # the slowest step so far, not the last
    clock.now += 119.0
    assert not dog.stalled()
    clock.now += 2.0
    assert dog.stalled()
    with dog.phase("validation"):
        assert dog.limit() == 40.0 and not dog.stalled()  # the phase restarts the clock
        clock.now += 41.0
        assert dog.stalled()
    assert not dog.stalled() and dog.limit() == 120.0  # a phase is not a step


def test_min_seconds_floor_and_bad_settings():
    clock = FakeClock()
    dog = watchdog.StepWatchdog(factor=2.0, min_seconds=50.0, clock=clock)
    clock.now += 1.0
    dog.step_done(1)
    assert dog.limit() == 50.0
    with pytest.raises(ValueError, match="watchdog_min_s=0"):
        watchdog.StepWatchdog(factor=2.0, min_seconds=0.0)
    with pytest.raises(ValueError, match="watchdog_factor=-1"):
        watchdog.StepWatchdog(factor=-1.0, min_seconds=1.0)


def test_a_stalled_process_dumps_every_thread_and_exits_with_its_status():
    """A real process whose "training loop" stops in a wait: the watchdog thread writes every
    thread's stack (the stuck main thread's frame and a helper thread's) and ends it."""
    script = textwrap.dedent(
        """
        import threading, time
        from caliber_jax import watchdog

        def stuck_in_collective():
            threading.Event().wait()

        threading.Thread(target=stuck_in_collective, name="peer", daemon=True).start()
        dog = watchdog.StepWatchdog(factor=3.0, min_seconds=0.2, poll_seconds=0.05,
                                    grace_seconds=0.1).start()
        for step in range(1, 4):
            time.sleep(0.1)
            dog.step_done(step)
        print("steps done", flush=True)
        stuck_in_collective()
        """
    )
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    elapsed = time.monotonic() - start
    assert result.returncode == watchdog.EXIT_STALLED, result.stderr[-3000:]
    assert "steps done" in result.stdout
    assert "watchdog:" in result.stderr and "after step 3" in result.stderr
    # faulthandler's dump: the main thread's frame and the other thread's.
    assert result.stderr.count("stuck_in_collective") >= 2, result.stderr[-3000:]
    assert "Current thread" in result.stderr or "Thread 0x" in result.stderr
    assert elapsed < 60


def test_off_and_closed_watchdogs_never_fire():
    fired = []
    dog = watchdog.StepWatchdog(factor=0.0, min_seconds=0.01, poll_seconds=0.01,
                                exit_fn=fired.append).start()  # fmt: skip
    time.sleep(0.1)
    dog.close()
    dog = watchdog.StepWatchdog(factor=1.0, min_seconds=5.0, poll_seconds=0.01,
                                exit_fn=fired.append).start()  # fmt: skip
    dog.step_done(1)
    dog.close()
    assert fired == []
