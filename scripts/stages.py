"""Runs the CLI stages of a study as subprocesses, independent ones side by side.

A stage is one user-facing command (`python -m caliber_jax.train ...`) with the stages it needs
first. With `jobs=1` the stages run one after the other and stream their output. With `jobs>1`
every stage whose prerequisites are done starts as soon as a slot is free: a small CPU spends a
good part of each process in single-threaded work (imports, tracing, XLA compiling, checkpoint
I/O), which a second process fills. Each concurrent stage then writes its output to
`<log_dir>/<stage>.log`, and the terminal gets one line when it starts and its summary when it
ends. Wall time per stage lands in `times` either way; the line a stage ends with gives its peak
resident memory, and for a stage a signal ended, the signal (`ended`).
"""

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from caliber_jax import host, provenance  # noqa: E402  (jax-free)
from caliber_jax.eval import significance  # noqa: E402  (jax-free)

SUMMARY_LINES = 3  # the last lines of a concurrent stage's log shown when it ends


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    args: tuple[str, ...]  # after `python`
    after: tuple[str, ...] = ()  # names of the stages that must finish first
    # Runs with nothing beside it, on every core: a compute-bound stage with no peer to pair
    # with (one training that all later stages wait for) is faster on all cores than on a share.
    alone: bool = False


def check_graph(stages: Sequence[Stage]) -> None:
    """Raises ValueError on a duplicate name or a prerequisite that is not an earlier stage."""
    seen: set[str] = set()
    for stage in stages:
        if stage.name in seen:
            raise ValueError(f"stage {stage.name!r} is defined twice")
        missing = [name for name in stage.after if name not in seen]
        if missing:
            raise ValueError(f"stage {stage.name!r} needs {missing}, which no earlier stage is")
        seen.add(stage.name)


def log_name(stage: str) -> str:
    """A file name for a stage's log: 'train LEAF s0' -> 'train_LEAF_s0.log'."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", stage).strip("_") + ".log"


def summary(text: str, lines: int = SUMMARY_LINES) -> list[str]:
    """The last `lines` lines of a log, each as a terminal would last show it (after its final
    carriage return, so a progress bar counts once, at its end state)."""
    shown = [line.rsplit("\r", 1)[-1].rstrip() for line in text.splitlines()]
    return [line for line in shown if line][-lines:]


def core_groups(jobs: int) -> list[tuple[int, ...]]:
    """This process's usable cores split into `jobs` disjoint groups, or [] where that cannot be
    done (fewer cores than jobs, or no affinity API)."""
    cores = host.usable_core_ids()
    if cores is None or jobs < 2 or len(cores) < jobs:
        return []
    return [tuple(cores[i::jobs]) for i in range(jobs)]


def startable(ready: Sequence[Stage], running: Sequence[Stage], jobs: int) -> list[Stage]:
    """The stages of `ready` (in priority order) to start now beside `running`, at most `jobs`
    at a time: an `alone` stage starts only when nothing runs and then starts alone; nothing
    starts beside a running `alone` stage, and no stage jumps ahead of a waiting `alone` one."""
    if any(stage.alone for stage in running):
        return []
    chosen: list[Stage] = []
    for stage in ready:
        if len(running) + len(chosen) >= jobs:
            break
        if stage.alone:
            return [stage] if not running and not chosen else chosen
        chosen.append(stage)
    return chosen


def _high_water(pid: int) -> int:
    """The process's peak resident memory so far in bytes (`VmHWM` of /proc/<pid>/status: its own
    address space since exec), 0 where that cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _waited(proc: subprocess.Popen) -> tuple[int, int]:
    """Waits for `proc` and returns (its return code, its peak resident memory in bytes).

    The peak is VmHWM, read while the process runs (every 0.05 s at first, then every 0.25 s).
    `os.wait4`'s ru_maxrss is no substitute: the kernel carries into it the resident size of the
    process that forked the stage (a test worker of several GiB), so it is used only where no
    reading came (a stage shorter than the first interval, or no /proc)."""
    peak, interval = 0, 0.05
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        peak = max(peak, _high_water(proc.pid))
        time.sleep(interval)
        interval = min(0.25, interval * 2)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait again
    unit = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return proc.returncode, peak or usage.ru_maxrss * unit


def ended(returncode: int, peak_bytes: int, seconds: float) -> str:
    """How a stage ended, in one line: "done in 807 s, peak memory 7.5 GiB", "FAILED (exit 2)
    ...", or, for a stage a signal ended, its name; SIGKILL also says that the kernel's
    out-of-memory killer sends it, since a log cut off mid-line is all that killer leaves."""
    memory = f"peak memory {peak_bytes / 2**30:.1f} GiB"
    if returncode == 0:
        return f"done in {seconds:.0f} s, {memory}"
    if returncode > 0:
        return f"FAILED (exit {returncode}) in {seconds:.0f} s, {memory}"
    name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else "?"
    line = f"FAILED: killed by {name} after {seconds:.0f} s, {memory}"
    if -returncode == signal.SIGKILL:
        line += (" (the kernel's out-of-memory killer sends SIGKILL when memory runs out: "
                 "`dmesg` says; run fewer stages side by side, --jobs 1)")  # fmt: skip
    return line


def run_stages(
    stages: Sequence[Stage], times: dict[str, float], *, cwd: Path, jobs: int = 1,
    log_dir: Path | None = None, pin_cores: bool = False,
) -> None:  # fmt: skip
    """Runs every stage once its prerequisites are done, at most `jobs` at a time.

    `pin_cores` (jobs > 1): each running stage gets its own share of the cores (`core_groups`),
    so that compute-bound stages side by side (two trainings) do not oversubscribe them; a
    process's thread pools are sized from its affinity.

    Raises subprocess.CalledProcessError for the first stage that fails, after the stages already
    running have ended (no new stage starts once one failed).
    """
    check_graph(stages)
    if jobs <= 1:
        for stage in stages:
            _stream(stage, times, cwd=cwd)
        return
    if log_dir is None:
        raise ValueError("run_stages: jobs > 1 needs a log_dir for the stages' output")
    log_dir.mkdir(parents=True, exist_ok=True)
    pending, done, failed = list(stages), set(), None
    # Each running stage with the cores it holds (None: unpinned), handed back when it ends.
    running: dict[futures.Future, tuple[Stage, tuple[int, ...] | None]] = {}
    free_cores = core_groups(jobs) if pin_cores else []
    with futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        while pending or running:
            ready = [s for s in pending if set(s.after) <= done] if failed is None else []
            for stage in startable(ready, [s for s, _ in running.values()], jobs):
                pending.remove(stage)
                cores = None if stage.alone else free_cores.pop(0) if free_cores else None
                where = f", cores {','.join(map(str, cores))}" if cores else ""
                print(f"== start {stage.name} (log: {log_dir / log_name(stage.name)}{where})",
                      flush=True)  # fmt: skip
                future = pool.submit(_logged, stage, log_dir, cwd, cores)
                running[future] = (stage, cores)
            if not running:
                break  # a failure stopped the rest
            finished, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
            for future in finished:
                stage, cores = running.pop(future)
                if cores:
                    free_cores.append(cores)
                returncode, seconds, text, peak = future.result()
                times[stage.name] = round(seconds, 1)
                print(f"== {stage.name}: {ended(returncode, peak, seconds)}", flush=True)
                for line in summary(text, SUMMARY_LINES if returncode == 0 else 20):
                    print(f"   {line}", flush=True)
                if returncode == 0:
                    done.add(stage.name)
                elif failed is None:
                    failed = subprocess.CalledProcessError(
                        returncode, [sys.executable, *stage.args]
                    )
    if failed is not None:
        raise failed


def _stream(stage: Stage, times: dict[str, float], *, cwd: Path) -> None:
    print(f"\n== {stage.name}: {' '.join(stage.args)}", flush=True)
    start = time.perf_counter()
    returncode, peak = _waited(subprocess.Popen([sys.executable, *stage.args], cwd=cwd))
    seconds = time.perf_counter() - start
    print(f"== {stage.name}: {ended(returncode, peak, seconds)}", flush=True)
    if returncode != 0:
        raise subprocess.CalledProcessError(returncode, [sys.executable, *stage.args])
    times[stage.name] = round(seconds, 1)


def _logged(
    stage: Stage, log_dir: Path, cwd: Path, cores: tuple[int, ...] | None = None
) -> tuple[int, float, str, int]:
    path = log_dir / log_name(stage.name)
    start = time.perf_counter()
    with path.open("w", encoding="utf-8") as log:
        log.write(f"$ python {' '.join(stage.args)}\n")
        log.flush()
        proc = subprocess.Popen(
            [sys.executable, *stage.args], cwd=cwd, stdout=log, stderr=subprocess.STDOUT
        )
        if cores:
            # Popen returns once the child has exec'd: a fresh interpreter with one thread, so
            # every thread it starts later (XLA's, BLAS's) inherits this set.
            with contextlib.suppress(ProcessLookupError):  # a stage that has already ended
                os.sched_setaffinity(proc.pid, cores)
        returncode, peak = _waited(proc)
    return returncode, time.perf_counter() - start, path.read_text(encoding="utf-8"), peak


def resolve_config(common: list[str]):
    """A config resolved the way the CLIs resolve it (config file + overrides), in this process:
    `common` holds `--config=...` and `--config.<field>=...` arguments only."""
    from absl import flags
    from ml_collections import config_flags

    # Config files import `configs.*` from the repository root, as `python -m caliber_jax...`
    # run from the root does; a script started as `python scripts/x.py` has only scripts/.
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    argv = ["study.py", *common]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", flag_values=values, sys_argv=argv)
    values(argv)
    return values.config


def config_value(common: list[str], field: str):
    """One field of `resolve_config(common)`."""
    value = resolve_config(common)
    for part in field.split("."):
        value = value[part]
    return value


def with_seed_means(
    results: dict[str, dict], against: str | None = None, pairs: Sequence[tuple[str, str]] = ()
) -> tuple[dict[str, dict], str]:
    """`results` plus each model trained on several seeds as its seed mean ("LEAF lp long s0+s1",
    restored, and marked so, when any of its seeds is), and the paired-test tables over them with
    every restored row marked; `against`: a model every trained one (not the Teacher nor an
    Initial) is also paired with (e.g. the plain model a user runs today); `pairs`: further
    (a, b) tests, run where both models (or seed means) are there."""
    means = significance.seed_means(results)
    for name, mean in means.items():
        head, seeds = name.rsplit(" ", 1)
        mean[provenance.KEY] = provenance.merged(
            {f"{head} {seed}": results[f"{head} {seed}"] for seed in seeds.split("+")}
        )
    models = {**results, **means}
    extra = [(label, against) for label in models
             if against in models and label != against and label != "Teacher"
             and not label.startswith("Initial")]  # fmt: skip
    extra += [(a, b) for a, b in pairs if a in models and b in models and (a, b) not in extra]
    return models, provenance.mark_cells(significance.paired_tables(models, extra=extra), models)


def record_file(path: Path, root: Path, record: Path | None) -> None:
    """Copies `path` (a file under `root`) to the same relative path under `record` (a tracked
    directory: run folders do not outlive their machine). Atomic; no-op without a record, and
    for a result that was itself restored from a record (its provenance stays the original's)."""
    if record is None or not path.is_file():
        return
    if path.suffix == ".json" and provenance.is_restored(_load_json(path)):
        return
    _copy_atomic(path, record / path.relative_to(root))


def restore_result(
    path: Path,
    root: Path,
    record: Path | None,
    *,
    config: str,
    data: str,
    who: str,
    restore_unverified: bool,
) -> bool:
    """Copies the recorded copy of `path` (a results JSON under `root` that the run lacks) into
    the run when its recorded config and data hashes are this run's (`provenance.check`; one
    with a hash never recorded only with `restore_unverified`), with its provenance marked
    restored. Prints one line when a record is refused. True when `path` is now there from the
    record."""
    recorded = None if record is None else record / path.relative_to(root)
    if path.is_file() or recorded is None or not recorded.is_file():
        return False
    saved = _load_json(recorded)
    refused = provenance.check(
        saved, config=config, data=data, restore_unverified=restore_unverified
    )
    if refused:
        print(f"{who}: {recorded.relative_to(record)} not restored: {refused}", flush=True)
        return False
    saved[provenance.KEY] = provenance.restored(saved)
    _write_json_atomic(path, saved)
    return True


def stale_result(
    path: Path,
    *,
    config: str | None,
    data: str,
    recompute: bool = False,
    restore_unverified: bool = False,
) -> str | None:
    """Why the results JSON at `path` (a run folder's, perhaps left there by an earlier run) must
    not stand for this run's row with hashes `config` and `data`, or None (it may, or there is no
    file). One line, for the caller to print.

    Its data hash must be this run's (the evaluator hashes the same evaluation files as the
    scripts). Its config hash is compared once a script has stamped it (`stamp_result`: then it
    is the row's); an evaluator's file not yet stamped holds only the evaluator's own settings
    hash, which a script cannot know beforehand. `config` None: the row's hash is not known here
    (data only). A file without a provenance block (written before blocks were kept) cannot be
    checked, so it is stale. A restored one is held to the restore rule (`provenance.check`), and
    with `recompute` (the user's `--recompute`) it is stale whatever its hashes.
    """
    if not path.is_file():
        return None
    try:
        saved = _load_json(path)
    except ValueError:  # a write cut short by an older, non-atomic writer
        return "not valid JSON"
    block = saved.get(provenance.KEY)
    if not isinstance(block, dict) or not block:
        return "no provenance block, so which data and config made it cannot be checked"
    commit = block.get("commit", provenance.UNKNOWN)
    if block.get("restored"):
        if recompute:
            return f"restored from a record (commit {commit}), and --recompute computes it again"
        own = block.get("config_hash", provenance.UNKNOWN) if config is None else config
        return provenance.check(saved, config=own, data=data, restore_unverified=restore_unverified)
    checks = [("data", data)]
    if config is not None and "eval_config_hash" in block:  # stamped: the row's config hash
        checks.insert(0, ("config", config))
    for name, current in checks:
        value = block.get(f"{name}_hash", provenance.UNKNOWN)
        if value != current:
            return f"{name} hash differs (computed {value} at commit {commit}, this run {current})"
    return None


def drop_stale(
    path: Path,
    root: Path,
    *,
    config: str | None,
    data: str,
    who: str,
    recompute: bool = False,
    restore_unverified: bool = False,
) -> bool:
    """Moves the results JSON at `path` (under `root`) aside to `<name>.stale` when this run must
    not use it (`stale_result`), with one line saying why, so that it is restored or computed
    again like a missing one. True when it was moved."""
    reason = stale_result(
        path, config=config, data=data, recompute=recompute, restore_unverified=restore_unverified
    )
    if reason is None:
        return False
    aside = path.with_name(path.name + ".stale")
    path.replace(aside)
    print(f"{who}: {path.relative_to(root)} in the run folder not used ({reason}); moved to "
          f"{aside.name}, to be restored or computed again", flush=True)  # fmt: skip
    return True


def stamp_result(path: Path, *, config: str, data: str) -> dict:
    """Gives the results JSON at `path` (computed by this run) the provenance block a script
    compares on restore: `config` (the script's hash of everything that made the row) replaces
    the evaluator's own settings hash, which is kept as `eval_config_hash`. A restored result is
    left as it is. Returns the JSON.

    Raises ValueError for a file this run cannot have computed (`stale_result`: no provenance
    block, another data hash, or once stamped another config hash): stamping it would pass an
    older result off as computed now. Callers set such files aside first (`drop_stale`).
    """
    reason = stale_result(path, config=config, data=data, restore_unverified=True)
    if reason is not None:
        raise ValueError(f"{path}: not this run's result, not stamped: {reason}")
    saved = _load_json(path)
    block = saved[provenance.KEY]
    if block.get("restored"):
        return saved
    if "eval_config_hash" not in block:
        block["eval_config_hash"] = block.get("config_hash", provenance.UNKNOWN)
    block.update(config_hash=config, data_hash=data)
    _write_json_atomic(path, saved)
    return saved


def keep_recorded(path: Path, root: Path, record: Path | None) -> str | None:
    """Records `path` (a file under `root`, rebuilt by this run, such as an evaluation set) when
    nothing is recorded yet. The rebuilt file always stays: when it differs from the recorded
    copy, returns the one line that says so (results scored on the recorded copy then fail the
    data-hash check and are computed again), else None."""
    if record is None or not path.is_file():
        return None
    recorded = record / path.relative_to(root)
    if not recorded.is_file():
        _copy_atomic(path, recorded)
        return None
    built, kept = provenance.data_hash([path]), provenance.data_hash([recorded])
    if built == kept:
        return None
    return (f"{path.relative_to(root)} rebuilt here (data hash {built}) differs from the "
            f"recorded {recorded} ({kept}): results scored on the recorded one are not "
            "restored")  # fmt: skip


def _load_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _write_json_atomic(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
    partial.replace(path)


def _copy_atomic(source: Path, target: Path) -> None:
    """Copies `source` to `target` through a temporary file: a killed copy leaves no half file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".tmp")
    partial.write_bytes(source.read_bytes())
    partial.replace(target)
