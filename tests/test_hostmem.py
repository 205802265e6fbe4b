"""`hostmem.retain_freed_memory`: a large buffer freed and allocated again reuses mapped pages."""

import json
import subprocess
import sys

import pytest

PROBE = """
import ctypes, ctypes.util, json, resource, sys
from caliber_jax import hostmem

applied = hostmem.retain_freed_memory() if sys.argv[1] == "retain" else False
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
size = 256 * 2**20  # far above glibc's largest mmap threshold (32 MB), like XLA's temp buffers
pointer = libc.malloc(size)
ctypes.memset(pointer, 1, size)  # touch every page
libc.free(pointer)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
pointer = libc.malloc(size)
ctypes.memset(pointer, 1, size)
after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps({"applied": applied, "faults": after - before}))
"""


def probe(mode: str) -> dict:
    result = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                            check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux's")
def test_freed_buffer_is_reused_without_page_faults():
    default, retained = probe("default"), probe("retain")
    assert retained["applied"] is True
    # Default glibc: the second 256 MB buffer is a fresh mmap, faulted in page by page (65,536
    # faults at 4 KB, 128 with 2 MB transparent huge pages); retained: the freed heap is reused.
    assert default["faults"] >= 128, default
    assert retained["faults"] < default["faults"] / 10, (default, retained)
