"""Host memory for XLA's CPU backend: glibc malloc keeps freed memory mapped for the next step.

XLA's CPU runtime allocates the temporaries of each program execution as one large buffer (1.5-2.5
GB for a MiniLM training step). glibc serves a request that large with a fresh `mmap` and returns it
with `munmap` when it is freed, so every step page-faults on every page it touches (3.7 million
minor faults in a 50 s benchmark) and then unmaps it again. With `mmap` off for malloc, one arena
and no trimming, the heap keeps those pages and the next step reuses them. The benchmarks
history (2026-11-25) has the measurement; the cost is a resident set that stays at its peak.

A heap that keeps what it frees can also keep what it cannot reuse. When a large freed buffer is
split by a small allocation, the next buffer of that size no longer fits in it and the heap grows
instead; a run whose programs have temporaries of several sizes (the packed layout's row counts,
a phase with mined questions) grew that way by one temporary a step, 3.3 GB at a time, to 14 GB in
a dozen steps (2026-11-29; `docs/benchmarks_history.md`). `release_fragments` watches for it from
a thread the entry points start with the retained heap: when the resident memory passes twice the
heap's peak in use (`should_release`), `malloc_trim` hands the free pages back. A heap that
reuses its buffers stays below that, so it keeps them; twice, because a heap that settles with
two temporaries and reuses them is as fast as one that never trims, where 1.25x cost ~20% of the
step rate (the same history, an A/B on two full-size phases).

That was measured on the CPU backend only, so the entry points (`cli.run`) apply it only when JAX
will run on the CPU (`planned_platform`): on a GPU or TPU the step's buffers live on the device,
and a host heap that never shrinks would only hold on to memory. The environment variable
`CALIBER_JAX_HOST_MALLOC` overrides that choice: `auto` (the default: CPU only), `retain` (apply
on every platform) or `default` (never: glibc's own behaviour).
"""

import ctypes
import ctypes.util
import importlib.metadata
import importlib.util
import os
import pkgutil
import threading
import time
from collections.abc import Mapping
from typing import NamedTuple

# <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
# (parameter, value): -1 as the trim threshold disables trimming (mallopt(3)); 0 mmaps at most;
# one arena, because a secondary (per-thread) arena's heap is capped at 64 MB and would fall back
# to mmap for the large buffers anyway.
SETTINGS = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))


def _libc():
    """The C library, or None where it cannot be found or loaded."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def retain_freed_memory() -> bool:
    """Applies `SETTINGS` through glibc's `mallopt`; returns False (and changes nothing) elsewhere.

    Call it before the first large allocation and before JAX starts its threads (an arena is
    chosen at a thread's first malloc): the entry points do it first thing, on the CPU only
    (`apply`, from `cli.run`).
    """
    libc = _libc()
    if libc is None:
        return False
    mallopt = getattr(libc, "mallopt", None)
    gnu_get_libc_version = getattr(libc, "gnu_get_libc_version", None)
    if mallopt is None or gnu_get_libc_version is None:  # musl and others: not glibc's malloc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in SETTINGS)


class Heap(NamedTuple):
    """What glibc's `mallinfo2` says of malloc's heaps: `size` bytes held from the system (its
    `arena`: every arena's heap, not the mmapped chunks), `in_use` of them allocated (`uordblks`)
    and `free` (`fordblks`, resident or handed back)."""

    size: int
    in_use: int
    free: int


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]  # fmt: skip


# The resident anonymous memory a retained heap may hold, as a multiple of the most it has had in
# use at once plus a constant for what is not the heap (Python's own arenas, compiled code):
# a heap that reuses its buffers stays below it (a phase's heap settles at ~1.8x: two temporaries).
RELEASE_FACTOR = 2.0
RELEASE_SLACK_BYTES = 512 * 2**20
RELEASE_INTERVAL_S = 0.25
# How often the watcher has handed free pages back, for tests and reports.
releases = 0


def heap(libc=None) -> Heap | None:
    """The heap now; None without glibc's `mallinfo2` (glibc < 2.33)."""
    libc = libc or _libc()
    mallinfo2 = getattr(libc, "mallinfo2", None)
    if mallinfo2 is None:
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return Heap(size=info.arena, in_use=info.uordblks, free=info.fordblks)


def resident_anonymous(status: str = "/proc/self/status") -> int | None:
    """RssAnon of /proc/self/status in bytes (the heap, mmapped memory, not mapped files); None
    where the file or the field is missing."""
    try:
        with open(status) as lines:
            for line in lines:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def should_release(
    resident: int,
    in_use_peak: int,
    factor: float = RELEASE_FACTOR,
    slack: int = RELEASE_SLACK_BYTES,
) -> bool:
    """Whether a process holding `resident` anonymous bytes, whose heap has had at most
    `in_use_peak` bytes in use at once, holds free memory it does not reuse. A heap that reuses
    a freed buffer holds about its peak; one whose freed buffers are split by small allocations
    (so the next buffer of that size no longer fits and the heap grows) holds one more buffer
    a step."""
    return resident > factor * in_use_peak + slack


def release_fragments(
    interval: float = RELEASE_INTERVAL_S,
    factor: float = RELEASE_FACTOR,
    slack: int = RELEASE_SLACK_BYTES,
) -> threading.Thread | None:
    """Starts a daemon thread that every `interval` seconds compares the resident memory with the
    heap's peak in use and, when `should_release`, hands the heap's free pages back to the system
    (`malloc_trim(0)`: the top of the heap and every whole free page inside it). None where glibc
    lacks `mallinfo2` or `malloc_trim`, or /proc/self/status has no RssAnon."""
    libc = _libc()
    if (
        libc is None
        or getattr(libc, "malloc_trim", None) is None
        or heap(libc) is None
        or resident_anonymous() is None
    ):
        return None
    libc.malloc_trim.argtypes = (ctypes.c_size_t,)

    def watch() -> None:
        global releases
        peak = 0
        while True:
            time.sleep(interval)
            peak = max(peak, heap(libc).in_use)
            if should_release(resident_anonymous(), peak, factor, slack):
                libc.malloc_trim(0)
                releases += 1

    thread = threading.Thread(target=watch, name="hostmem-release", daemon=True)
    thread.start()
    return thread


ENV = "CALIBER_JAX_HOST_MALLOC"
MODES = ("auto", "retain", "default")


def accelerator_plugins() -> list[str]:
    """The installed JAX plugins for a GPU or TPU (`jax_plugins.*` modules, entry points, libtpu).

    JAX starts one of them, in preference to the CPU, whenever it finds its device.
    """
    found = set()
    spec = importlib.util.find_spec("jax_plugins")
    if spec is not None and spec.submodule_search_locations:
        found |= {name for _, name, _ in pkgutil.iter_modules(spec.submodule_search_locations)}
    found |= {entry.name for entry in importlib.metadata.entry_points(group="jax_plugins")}
    if importlib.util.find_spec("libtpu") is not None:
        found.add("libtpu")
    return sorted(found)


def planned_platform(environ: Mapping[str, str] = os.environ) -> str:
    """The platform JAX will run on, as far as it can be told before JAX starts.

    The first entry of `JAX_PLATFORMS` (or the older `JAX_PLATFORM_NAME`) when set; otherwise
    "accelerator" when a GPU or TPU plugin is installed (`accelerator_plugins`), else "cpu".
    """
    chosen = environ.get("JAX_PLATFORMS") or environ.get("JAX_PLATFORM_NAME") or ""
    first = chosen.split(",")[0].strip().lower()
    if first:
        return first
    return "accelerator" if accelerator_plugins() else "cpu"


def apply(platform: str | None = None, environ: Mapping[str, str] = os.environ) -> bool:
    """`retain_freed_memory()` where it was measured to help, the CPU backend; returns whether it
    was applied. `platform` defaults to `planned_platform(environ)`; `environ[ENV]` overrides.

    Raises:
      ValueError: `environ[ENV]` is not one of `MODES`.
    """
    mode = environ.get(ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{ENV}={environ[ENV]!r}: expected one of {', '.join(MODES)}")
    if mode == "default":
        return False
    if mode == "auto" and (platform or planned_platform(environ)).lower() != "cpu":
        return False
    return retain_freed_memory()


def watched(retained: bool) -> bool:
    """`release_fragments` beside a heap that `retained` says is kept; returns `retained`."""
    if retained:
        release_fragments()
    return retained


def apply_and_watch(platform: str | None = None, environ: Mapping[str, str] = os.environ) -> bool:
    """`apply`, and where it retained freed memory, `release_fragments` beside it: what the entry
    points call first of all."""
    return watched(apply(platform, environ))
