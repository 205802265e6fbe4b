"""Host memory for XLA's CPU backend: glibc malloc keeps freed memory mapped for the next step.

XLA's CPU runtime allocates the temporaries of each program execution as one large buffer (1.5-2.5
GB for a MiniLM training step). glibc serves a request that large with a fresh `mmap` and returns it
with `munmap` when it is freed, so every step page-faults on every page it touches (3.7 million
minor faults in a 50 s benchmark) and then unmaps it again. With `mmap` off for malloc, one arena
and no trimming, the heap keeps those pages and the next step reuses them. The benchmarks
history (2026-11-25) has the measurement; the cost is a resident set that stays at its peak.

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
from collections.abc import Mapping

# <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
# (parameter, value): -1 as the trim threshold disables trimming (mallopt(3)); 0 mmaps at most;
# one arena, because a secondary (per-thread) arena's heap is capped at 64 MB and would fall back
# to mmap for the large buffers anyway.
SETTINGS = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))


def retain_freed_memory() -> bool:
    """Applies `SETTINGS` through glibc's `mallopt`; returns False (and changes nothing) elsewhere.

    Call it before the first large allocation and before JAX starts its threads (an arena is
    chosen at a thread's first malloc): the entry points do it first thing, on the CPU only
    (`apply`, from `cli.run`).
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    gnu_get_libc_version = getattr(libc, "gnu_get_libc_version", None)
    if mallopt is None or gnu_get_libc_version is None:  # musl and others: not glibc's malloc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in SETTINGS)


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
