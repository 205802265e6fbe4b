"""Host memory for XLA's CPU backend: glibc malloc keeps freed memory mapped for the next step.

XLA's CPU runtime allocates the temporaries of each program execution as one large buffer (1.5-2.5
GB for a MiniLM training step). glibc serves a request that large with a fresh `mmap` and returns it
with `munmap` when it is freed, so every step page-faults on every page it touches (3.7 million
minor faults in a 50 s benchmark) and then unmaps it again. With `mmap` off for malloc, one arena
and no trimming, the heap keeps those pages and the next step reuses them. BENCHMARKS.md (session
9) has the measurement; the cost is a resident set that stays at its peak.
"""

import ctypes
import ctypes.util

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
    chosen at a thread's first malloc): the entry points do it first thing (`cli.run`).
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
