"""What every entry point shares: quiet logs, the persistent XLA compilation cache and what it
compiled, one-line errors.

    if __name__ == "__main__":
        ...DEFINE flags...
        cli.run(main)

Flags added here (only when `run` is called, so tests can import entry-point modules):
`--compilation_cache` (a directory, or "none"), `--traceback` (show the Python traceback of an
error instead of one line). absl's `--verbosity` turns INFO logging back on.
"""

import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from absl import app, flags, logging

from caliber_jax import hostmem

# Errors that mean "your input or config is wrong" rather than "caliber_jax has a bug".
USER_ERRORS = (
    ValueError,
    OSError,  # missing/unreadable files and directories, a config file that does not load
    KeyError,
    json.JSONDecodeError,
    FloatingPointError,
    app.UsageError,
)
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


def default_cache_dir() -> str:
    """`$CALIBER_JAX_CACHE`, else `$XDG_CACHE_HOME/caliber_jax/xla`, else `~/.cache/...`."""
    if os.environ.get("CALIBER_JAX_CACHE"):
        return os.environ["CALIBER_JAX_CACHE"]
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "caliber_jax", "xla")


def gpu_plugin_installed() -> bool:
    """Whether jaxlib's CUDA or ROCm plugin is installed (`hostmem.accelerator_plugins`, found
    without starting a backend, so before `jax.distributed.initialize`)."""
    return any(
        name.startswith(("xla_cuda", "xla_rocm", "cuda", "rocm"))
        for name in hostmem.accelerator_plugins()
    )


def enable_compilation_cache(cache_dir: str | None) -> None:
    """Turns on JAX's persistent compilation cache in `cache_dir` (None or "none": off).

    Every program is cached, however fast it compiled: on a CPU most step programs compile in a
    few seconds, below JAX's default one-second-and-up threshold only in aggregate. Where a GPU
    plugin is installed, XLA's autotuner keeps its per-fusion results in the same directory
    (`xla_gpu_per_fusion_autotune_cache_dir/`), so a program that is not in the cache (a new
    batch shape, another lambda or model depth) still skips timing the kernels it shares with one
    that was; set here rather than left to JAX's default, which may change. That setting puts the
    directory's path into every program's cache key, so such a cache moved or copied elsewhere
    is read as empty; without a GPU plugin (CPU, TPU) there is no autotuner, it is off, and the
    cache is read at any path.
    """
    import jax

    if not cache_dir or cache_dir.lower() == "none":
        return
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    autotune = "xla_gpu_per_fusion_autotune_cache_dir" if gpu_plugin_installed() else "none"
    jax.config.update("jax_persistent_cache_enable_xla_caches", autotune)


class CompileStats:
    """Counts XLA programs built in this process, split into compiled and read from the cache.

    Listens to JAX's monitoring events: every backend compile request records its duration
    (cache reads included), every persistent-cache hit records an event.
    """

    _BACKEND = "/jax/core/compile/backend_compile_duration"
    _TRACE = "/jax/core/compile/jaxpr_trace_duration"
    _LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
    _HIT = "/jax/compilation_cache/cache_hits"

    def __init__(self):
        self._lock = threading.Lock()
        self.requests = 0
        self.cache_hits = 0
        self.seconds = 0.0
        self.trace_seconds = 0.0  # Python tracing to jaxprs (cache hits still trace)
        self.lower_seconds = 0.0  # jaxpr -> StableHLO
        self._active = False

    def start(self) -> "CompileStats":
        """Registers the listeners (once)."""
        from jax import monitoring

        if not self._active:
            monitoring.register_event_duration_secs_listener(self._on_duration)
            monitoring.register_event_listener(self._on_event)
            self._active = True
        return self

    def _on_duration(self, event: str, duration: float, **kwargs: Any) -> None:
        del kwargs
        with self._lock:
            if event == self._BACKEND:
                self.requests += 1
                self.seconds += duration
            elif event == self._TRACE:
                self.trace_seconds += duration
            elif event == self._LOWER:
                self.lower_seconds += duration

    def _on_event(self, event: str, **kwargs: Any) -> None:
        del kwargs
        if event == self._HIT:
            with self._lock:
                self.cache_hits += 1

    @property
    def compiled(self) -> int:
        """Programs XLA compiled from scratch (not found in the persistent cache)."""
        return self.requests - self.cache_hits

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {
                "programs": self.requests,
                "compiled": self.requests - self.cache_hits,
                "cache_hits": self.cache_hits,
                "compile_seconds": round(self.seconds, 3),
                "trace_seconds": round(self.trace_seconds, 3),
                "lower_seconds": round(self.lower_seconds, 3),
            }


COMPILE_STATS = CompileStats()


def startup_line(marks: list[tuple[str, float]], stats: dict[str, float]) -> str:
    """One line on where the time from `train()` to the first step's end went: `marks` are
    (phase, perf_counter at its end) after ("began", t0); the first step's share includes what
    `COMPILE_STATS.snapshot()` (`stats`) counts so far, summed over threads: XLA compiling or
    loading programs from the persistent cache, and JAX tracing and lowering (a cache hit still
    traces and lowers)."""
    total = marks[-1][1] - marks[0][1]
    phases = ", ".join(f"{name} {end - begin:.1f} s"
                       for (_, begin), (name, end) in itertools.pairwise(marks))  # fmt: skip
    xla = (
        f"XLA compiling or loading so far: {stats['compile_seconds']:.1f} s; tracing "
        f"{stats['trace_seconds']:.1f} s, lowering {stats['lower_seconds']:.1f} s; "
        f"{stats['programs']:.0f} programs, {stats['cache_hits']:.0f} from the cache"
    )
    return f"first step done {total:.1f} s after train() began: {phases} ({xla})"


def compile_summary(
    step_programs: int, *, ahead: int = 0, build_seconds: Sequence[float] = (), show: bool = True
) -> dict[str, float]:
    """What this process compiled: step programs (batch shapes) and all XLA programs; `show`
    prints it as one line (a run's first process does).

    `compile/compiled` counts programs XLA built from scratch; the rest came from the persistent
    compilation cache (`--compilation_cache`), so a second identical launch reports 0 there.
    `compile/step_programs_ahead`: step programs built on the compile-ahead thread.
    `build_seconds` (compile-ahead's, in the order the programs finished): the first step's
    program, built alone, as `compile/first_program_s` (the autotuner's trade is read against
    it), and the longest as `compile/program_s_max`.
    """
    stats = COMPILE_STATS.snapshot()
    built = ""
    if build_seconds:
        built = (f"; step programs built in {build_seconds[0]:.1f} s (the first, alone), "
                 f"{max(build_seconds):.1f} s the longest")  # fmt: skip
    if show:
        print(
            f"compile: {step_programs} train-step shapes ({ahead} built ahead of their step); "
            f"{stats['programs']} XLA programs, "
            f"{stats['compiled']} compiled, {stats['cache_hits']} from the persistent cache, "
            f"{stats['compile_seconds']:.1f} s compiling or loading "
            f"(+ {stats['trace_seconds']:.1f} s tracing, {stats['lower_seconds']:.1f} s lowering)"
            f"{built}",
            flush=True,
        )
    timed = {}
    if build_seconds:
        timed = {"compile/first_program_s": float(build_seconds[0]),
                 "compile/program_s_max": float(max(build_seconds))}  # fmt: skip
    return {
        "compile/step_programs": float(step_programs),
        "compile/step_programs_ahead": float(ahead),
        **{f"compile/{key}": float(value) for key, value in stats.items()},
        **timed,
    }


def format_error(error: BaseException) -> str:
    """The one line printed for a user error: `error: <message>` (the message names file/line)."""
    message = str(error)
    if isinstance(error, KeyError) and error.args:
        message = str(error.args[0])
    if isinstance(error, FileNotFoundError) and error.filename and error.filename not in message:
        message = f"{error.filename}: {error.strerror or 'not found'}"
    message = " ".join(line.strip() for line in message.splitlines() if line.strip())
    return f"error: {message or type(error).__name__}"


def exit_with_one_line(error: BaseException) -> NoReturn:
    """The end of a run stopped by a user error: its one line on stderr, exit status 2."""
    print(format_error(error), file=sys.stderr, flush=True)
    sys.exit(EXIT_USER_ERROR)


def guard(main: Callable[[list[str]], Any]) -> Callable[[list[str]], Any]:
    """Wraps an absl `main`: user errors become one line on stderr and exit status 2."""

    def wrapped(argv: list[str]) -> Any:
        _configure()
        try:
            return main(argv)
        except USER_ERRORS as error:
            if flags.FLAGS.traceback:
                raise
            exit_with_one_line(error)
        except KeyboardInterrupt:
            if flags.FLAGS.traceback:
                raise
            print("[caliber_jax] interrupted (Ctrl-C)", file=sys.stderr, flush=True)
            sys.exit(EXIT_INTERRUPTED)

    return wrapped


def _configure() -> None:
    """Quiet logs unless --verbosity was given; the compilation cache unless turned off."""
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
        # Orbax and grain also log through Python's logging below absl's handler.
        import logging as std_logging

        for name in ("", "absl", "orbax", "grain", "jax", "bm25s"):
            std_logging.getLogger(name).setLevel(std_logging.WARNING)
    enable_compilation_cache(flags.FLAGS.compilation_cache)
    COMPILE_STATS.start()


def define_flags() -> None:
    """The flags every entry point shares (defined once)."""
    if "compilation_cache" not in flags.FLAGS:
        flags.DEFINE_string(
            "compilation_cache",
            default_cache_dir(),
            "Persistent XLA compilation cache directory; 'none' turns it off.",
        )
    if "traceback" not in flags.FLAGS:
        flags.DEFINE_boolean("traceback", False, "Show Python tracebacks of input errors.")


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing whose errors (unknown flag, bad value, config override typo) are one line.

    ml_collections reports a mistyped `--config.a.b=...` as AttributeError/KeyError from inside
    flag parsing, before `main` runs, so `guard` cannot see it.
    """
    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        message = _without_traceback(str(error))
    except (AttributeError, KeyError, TypeError, ValueError, OSError) as error:
        # OSError: a config file that failed to load, read again by an override after it.
        if "--traceback" in argv:
            raise
        # ml_collections wraps a KeyError ("'lrr'\nDid you mean ...") in an AttributeError: its
        # str() is the repr of the message, escapes and all. Unwrap to the text, on one line.
        detail: Any = error
        while isinstance(detail, BaseException) and detail.args:
            detail = detail.args[0]
        text = " ".join(line.strip() for line in str(detail).splitlines() if line.strip())
        message = f"command line: invalid config override or flag value: {text}"
    print(f"error: {message}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


def _without_traceback(message: str) -> str:
    """ml_collections puts the Python traceback of a config file's own error into the flag error
    ("flag --config=x.py:v: Error whilst parsing config file:\n\nTraceback ...\nValueError: ..."):
    its first line and the exception's line, joined."""
    if "Traceback (most recent call last):" not in message:
        return message
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return f"{lines[0]} {lines[-1]}"


def run(main: Callable[[list[str]], Any]) -> None:
    """`absl.app.run(main)` with the shared flags, quiet logs, cache, and one-line errors.

    First of all, before JAX starts: on the CPU backend, freed host memory stays mapped for reuse
    (`hostmem`; `CALIBER_JAX_HOST_MALLOC=retain|default` overrides), with a thread that hands
    back free memory the heap could not reuse (`hostmem.release_fragments`).
    """
    try:
        hostmem.apply_and_watch()
    except ValueError as error:
        exit_with_one_line(error)
    define_flags()
    app.run(guard(main), flags_parser=parse_flags)


def run_script(main: Callable[[], Any]) -> None:
    """An argparse script's `main()` with one-line user errors (exit status 2); `--traceback`
    among the arguments shows the traceback instead."""
    try:
        main()
    except USER_ERRORS as error:
        if "--traceback" in sys.argv[1:]:
            raise
        exit_with_one_line(error)


def stage(message: str, started: float) -> None:
    """One summary line per stage on stderr: `[caliber_jax] <message> (12.3 s)`."""
    print(f"[caliber_jax] {message} ({time.perf_counter() - started:.1f} s)", file=sys.stderr)
