"""Runs the CLI stages of a study as subprocesses, independent ones side by side.

A stage is one user-facing command (`python -m caliber_jax.train ...`) with the stages it needs
first. With `jobs=1` the stages run one after the other and stream their output. With `jobs>1`
every stage whose prerequisites are done starts as soon as a slot is free: a small CPU spends a
good part of each process in single-threaded work (imports, tracing, XLA compiling, checkpoint
I/O), which a second process fills. Each concurrent stage then writes its output to
`<log_dir>/<stage>.log`, and the terminal gets one line when it starts and its summary when it
ends. Wall time per stage lands in `times` either way.
"""

import contextlib
import dataclasses
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from caliber_jax import host  # noqa: E402  (jax-free)

SUMMARY_LINES = 3  # the last lines of a concurrent stage's log shown when it ends


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    args: tuple[str, ...]  # after `python`
    after: tuple[str, ...] = ()  # names of the stages that must finish first


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
            for stage in ready[: jobs - len(running)]:
                pending.remove(stage)
                cores = free_cores.pop(0) if free_cores else None
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
                returncode, seconds, text = future.result()
                times[stage.name] = round(seconds, 1)
                print(f"== {stage.name}: {'done' if returncode == 0 else 'FAILED'} in "
                      f"{seconds:.0f} s", flush=True)  # fmt: skip
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
    subprocess.run([sys.executable, *stage.args], cwd=cwd, check=True)
    times[stage.name] = round(time.perf_counter() - start, 1)


def _logged(
    stage: Stage, log_dir: Path, cwd: Path, cores: tuple[int, ...] | None = None
) -> tuple[int, float, str]:
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
        returncode = proc.wait()
    return returncode, time.perf_counter() - start, path.read_text(encoding="utf-8")


def config_value(common: list[str], field: str):
    """One config field resolved the way the CLIs resolve it (config file + overrides), in this
    process: `common` holds `--config=...` and `--config.<field>=...` arguments only."""
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
    value = values.config
    for part in field.split("."):
        value = value[part]
    return value


def record_file(path: Path, root: Path, record: Path | None) -> None:
    """Copies `path` (a file under `root`) to the same relative path under `record` (a tracked
    directory: run folders do not outlive their machine). Atomic; no-op without a record."""
    if record is None or not path.is_file():
        return
    _copy_atomic(path, record / path.relative_to(root))


def restore_records(record: Path | None, root: Path, pattern: str = "**/*.json") -> list[str]:
    """Copies every recorded file matching `pattern` that `root` lacks back under `root`;
    returns their relative paths. Files already under `root` are never overwritten."""
    if record is None or not record.is_dir():
        return []
    restored = []
    for path in sorted(record.glob(pattern)):
        target = root / path.relative_to(record)
        if path.is_file() and not target.exists():
            _copy_atomic(path, target)
            restored.append(str(path.relative_to(record)))
    return restored


def keep_recorded(path: Path, root: Path, record: Path | None) -> bool:
    """Makes `path` (a file under `root`, rebuilt by this run) the recorded copy when there is
    one, else records it; True when the rebuilt file differed and was replaced. For inputs every
    recorded result depends on, such as an evaluation set that another machine may rebuild a
    little differently."""
    if record is None or not path.is_file():
        return False
    recorded = record / path.relative_to(root)
    if not recorded.is_file():
        _copy_atomic(path, recorded)
        return False
    if recorded.read_bytes() == path.read_bytes():
        return False
    _copy_atomic(recorded, path)
    return True


def _copy_atomic(source: Path, target: Path) -> None:
    """Copies `source` to `target` through a temporary file: a killed copy leaves no half file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".tmp")
    partial.write_bytes(source.read_bytes())
    partial.replace(target)
