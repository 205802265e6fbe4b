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


FRAGMENTS = """
import ctypes, ctypes.util, json, sys, time
from caliber_jax import hostmem

mode = sys.argv[1]  # "keep" (no watcher), "watch" (a watcher with a 160 MiB cap), "reuse"
assert hostmem.retain_freed_memory()
mib = 2**20
if mode == "watch":  # the mechanism: a fixed cap on resident memory (factor 0)
    assert hostmem.release_fragments(interval=0.02, factor=0.0, slack=160 * mib) is not None
if mode == "reuse":  # the entry points' rule
    assert hostmem.release_fragments(interval=0.02) is not None
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)


def resident():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS"))


held, peak = [], 0
for step in range(6):
    size = (64 + step) * mib
    temporary = libc.malloc(size)
    ctypes.memset(temporary, 1, size)
    if mode == "reuse":  # the same buffer freed and allocated again: the heap reuses it
        libc.free(temporary)
        size = 64 * mib
    else:
        # Temporaries a little larger than any earlier (so none fits a hole), touched; then
        # something allocated after them (so they are not at the heap's top), never touched;
        # then the temporaries freed: holes that no later request fits, each resident.
        held.append(libc.malloc(size + mib // 2))
        libc.free(temporary)
    time.sleep(0.3)  # the watcher looks every 0.02 s
    peak = max(peak, resident())
print(json.dumps({"peak": peak, "heap": hostmem.heap().size, "releases": hostmem.releases}))
"""


def fragments(mode: str) -> dict:
    result = subprocess.run([sys.executable, "-c", FRAGMENTS, mode], capture_output=True,
                            text=True, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@linux_only
def test_free_memory_the_heap_does_not_reuse_is_handed_back():
    mib = 2**20
    kept, watched = fragments("keep"), fragments("watch")
    # Unwatched, every freed temporary stays resident in a heap that grows past it.
    assert kept["releases"] == 0 and kept["heap"] >= 6 * 2 * 64 * mib, kept
    assert kept["peak"] >= 6 * 64 * mib, kept
    # Watched: the heap grows as much (no hole fits), but once the resident memory passes the
    # cap the holes' pages go back.
    assert watched["releases"] >= 1 and watched["heap"] >= 6 * 2 * 64 * mib, watched
    assert watched["peak"] <= 160 * mib + 2 * 70 * mib, (kept, watched)


@linux_only
def test_a_heap_that_reuses_its_buffer_keeps_it():
    # The entry points' rule (resident within 2x the peak in use + 512 MiB): never released,
    # so the buffer is reused without page faults (`test_freed_buffer_is_reused...`).
    reused = fragments("reuse")
    assert reused["releases"] == 0, reused
    assert reused["peak"] >= 64 * 2**20, reused


def test_the_release_rule():
    gib = 2**30
    # A step needs 4 GiB at once; resident beside it, the slack for what is not the heap.
    assert not hostmem.should_release(4 * gib + 300 * 2**20, 4 * gib)
    # A heap settled with two temporaries that it reuses (a phase: 7.5 GB at 4.1 GB in use): kept.
    assert not hostmem.should_release(int(7.5 * gib), int(4.1 * gib))
    # A third temporary held resident (the heap growing a step at a time): release.
    assert hostmem.should_release(11 * gib, int(4.1 * gib))
    assert not hostmem.should_release(5 * gib, 4 * gib, factor=1.25, slack=0)
    assert hostmem.should_release(5 * gib + 1, 4 * gib, factor=1.25, slack=0)


def test_resident_anonymous_reads_the_status_file(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmRSS:\t 2048 kB\nRssAnon:\t 1536 kB\nRssFile:\t512 kB\n")
    assert hostmem.resident_anonymous(str(status)) == 1536 * 1024
    status.write_text("Name:\tpython\n")
    assert hostmem.resident_anonymous(str(status)) is None
    assert hostmem.resident_anonymous(str(tmp_path / "missing")) is None
