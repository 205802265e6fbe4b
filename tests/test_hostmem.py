"""`hostmem`: a large buffer freed and allocated again reuses mapped pages, on the CPU backend only
unless `CALIBER_JAX_HOST_MALLOC` says otherwise."""

import json
import os
import subprocess
import sys

import pytest

from caliber_jax import hostmem

PROBE = """
import ctypes, ctypes.util, json, resource, sys
from caliber_jax import hostmem

mode = sys.argv[1]  # "retain", "default", or "apply:<platform>" (what the entry points call)
if mode == "retain":
    applied = hostmem.retain_freed_memory()
elif mode == "default":
    applied = False
else:
    applied = hostmem.apply(mode.split(":")[1] or None)
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
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")


def probe(mode: str, switch: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (hostmem.ENV, "JAX_PLATFORMS")}
    if switch is not None:
        env[hostmem.ENV] = switch
    result = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                            env=env, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@linux_only
def test_freed_buffer_is_reused_without_page_faults():
    default, retained = probe("default"), probe("retain")
    assert retained["applied"] is True
    # Default glibc: the second 256 MB buffer is a fresh mmap, faulted in page by page (65,536
    # faults at 4 KB, 128 with 2 MB transparent huge pages); retained: the freed heap is reused.
    assert default["faults"] >= 128, default
    assert retained["faults"] < default["faults"] / 10, (default, retained)


@linux_only
def test_applied_on_the_cpu_backend_only_unless_switched():
    default = probe("default")
    cpu = probe("apply:cpu")
    assert cpu["applied"] is True and cpu["faults"] < default["faults"] / 10, (default, cpu)
    for platform in ("cuda", "tpu", "accelerator"):
        other = probe(f"apply:{platform}")
        # Not applied: glibc's own behaviour, a fresh mmap faulted in again.
        assert other["applied"] is False and other["faults"] >= 128, (platform, other)
    off = probe("apply:cpu", switch="default")
    assert off["applied"] is False and off["faults"] >= 128, off
    forced = probe("apply:cuda", switch="retain")
    assert forced["applied"] is True and forced["faults"] < default["faults"] / 10, forced


def test_planned_platform_reads_jax_platforms_before_jax_starts():
    assert hostmem.planned_platform({"JAX_PLATFORMS": "cuda,cpu"}) == "cuda"
    assert hostmem.planned_platform({"JAX_PLATFORMS": "CPU"}) == "cpu"
    assert hostmem.planned_platform({"JAX_PLATFORM_NAME": "tpu"}) == "tpu"
    # Nothing set: JAX prefers an installed GPU/TPU plugin (none in a CPU-only install).
    unset = hostmem.planned_platform({})
    assert unset == ("accelerator" if hostmem.accelerator_plugins() else "cpu")
    # A platform other than the CPU: not applied, and nothing reaches glibc.
    assert hostmem.apply(environ={"JAX_PLATFORMS": "cuda"}) is False
    assert hostmem.apply("tpu", environ={}) is False


def test_a_bad_switch_value_is_one_line_at_the_entry_point():
    with pytest.raises(ValueError, match="CALIBER_JAX_HOST_MALLOC='sometimes'"):
        hostmem.apply("cpu", environ={hostmem.ENV: "sometimes"})
    env = dict(os.environ, **{hostmem.ENV: "sometimes"})
    result = subprocess.run([sys.executable, "-m", "caliber_jax.export"], capture_output=True,
                            text=True, env=env, check=False)  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == (
        "error: CALIBER_JAX_HOST_MALLOC='sometimes': expected one of auto, retain, default"
    )
