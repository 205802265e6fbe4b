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


def test_a_step_completing_in_the_grace_period_cancels_the_exit():
    """A slow step overruns its limit (stacks dumped), then completes within the grace period:
    the run goes on, and the watchdog keeps watching it."""
    fired = []
    dog = watchdog.StepWatchdog(factor=1.0, min_seconds=0.1, poll_seconds=0.01,
                                grace_seconds=1.5, exit_fn=fired.append).start()  # fmt: skip
    dog.step_done(1)  # a fast first step: the limit is min_seconds
    time.sleep(0.6)  # step 2 overruns 0.1 s: the dump, then the grace period
    dog.step_done(2)  # ...and completes within it; steps go on at the new pace
    end = time.monotonic() + 2.0  # past the end of the grace period
    step_num = 2
    while time.monotonic() < end:
        time.sleep(0.02)
        step_num += 1
        dog.step_done(step_num)
    assert fired == []
    assert not dog.stalled()
    dog.close()


def test_a_dump_without_progress_exits_after_the_grace_period_and_progress_resumes_watching(
    capfd,
):
    clock = FakeClock()
    fired = []
    dog = watchdog.StepWatchdog(factor=2.0, min_seconds=10.0, clock=clock, grace_seconds=5.0,
                                exit_fn=fired.append)  # fmt: skip
    clock.now += 1.0
    dog.step_done(1)
    clock.now += 9.0
    dog.check()
    assert capfd.readouterr().err == ""  # 9 s: within max(10, 2 x 1)
    clock.now += 2.0
    dog.check()  # 11 s: stalled
    err = capfd.readouterr().err
    assert "watchdog: 11 s without a step completing after step 1" in err
    assert "within 5 s" in err and "test_watchdog.py" in err  # the stack dump
    clock.now += 4.0
    dog.check()
    assert fired == []  # still in the grace period
    dog.step_done(2)  # a 15 s step completed in it
    clock.now += 2.0
    dog.check()
    assert fired == [] and "step 2 completed" in capfd.readouterr().err
    clock.now += 27.0
    dog.check()
    assert fired == []  # 29 s: the limit is now 2 x 15 s
    clock.now += 2.0
    dog.check()  # 31 s: stalled again; no progress this time
    assert "after step 2" in capfd.readouterr().err
    clock.now += 4.9
    dog.check()
    assert fired == []
    clock.now += 0.2
    dog.check()
    assert fired == [watchdog.EXIT_STALLED]


def test_start_up_new_shapes_and_closing_get_the_long_limit(capfd):
    """From its start to the first step, in a step whose batch shape is new (it compiles, or
    waits for compile-ahead) and while closing, the limit is factor x min_seconds."""
    clock = FakeClock()
    dog = watchdog.StepWatchdog(factor=4.0, min_seconds=10.0, clock=clock, grace_seconds=1.0,
                                exit_fn=lambda status: None)  # fmt: skip
    assert dog.limit() == 40.0  # start-up
    with dog.phase("validation"):  # validation before the first step (eval_at_start)
        clock.now += 39.0
        assert not dog.stalled()
    clock.now += 39.0
    assert dog.limit() == 40.0 and not dog.stalled()  # back in start-up, clock restarted
    clock.now += 2.0
    dog.check()
    assert "41 s in start-up before the first step" in capfd.readouterr().err
    dog.enter("compile")  # step 1's program compiles: progress, the dump is cancelled
    dog.check()
    assert "progress after the dump (now in compile)" in capfd.readouterr().err
    clock.now += 1.0
    dog.step_done(1)  # compiled ahead: 1 s
    assert dog.limit() == 10.0  # max(min_seconds, 4 x 1 s)
    dog.enter("compile")  # step 2's batch has a shape not run before
    assert dog.limit() == 40.0
    clock.now += 39.0
    assert not dog.stalled()
    clock.now += 2.0
    dog.check()
    assert "41 s in compile after step 1" in capfd.readouterr().err
    dog.step_done(2)
    assert dog.limit() == 164.0  # a step that compiles counts with its compile time
    clock.now += 1.0
    dog.step_done(3)
    dog.enter("closing")
    clock.now += 100.0
    assert dog.limit() == 40.0 and dog.stalled()
    dog.check()
    assert "100 s in closing after step 3" in capfd.readouterr().err
