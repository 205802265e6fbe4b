"""What this host lets the process use; imports nothing heavy, so PyTorch-only scripts share it."""

import functools
import os
import re
from pathlib import Path

# CPU features that multiply bfloat16 natively (x86 AVX512_BF16 and AMX, Arm's BF16 extension).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
# XLA's `--xla_cpu_max_isa` levels below AVX512_BF16 (the last one given wins, as in XLA).
ISAS_WITHOUT_BF16 = ("SSE4_2", "AVX", "AVX2", "AVX512", "AVX512_VNNI")


def usable_core_ids() -> list[int] | None:
    """The ids of the cores this process may run on (its CPU affinity: taskset, cgroup cpusets,
    Slurm), sorted; None where the platform has no affinity API (macOS)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return None


def usable_cores() -> int:
    """How many cores this process may run on: its CPU affinity, which `os.cpu_count()` ignores."""
    ids = usable_core_ids()
    return len(ids) if ids is not None else os.cpu_count() or 1


@functools.cache
def cpu_flags(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> frozenset[str]:
    """The first processor's feature flags (x86 `flags`, Arm `Features`) in /proc/cpuinfo; empty
    where there is none (macOS). Read once per path (every bfloat16 Linear asks)."""
    path = Path(cpuinfo)
    if not path.is_file():
        return frozenset()
    for line in path.read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def held_below_bf16(xla_flags: str | None = None) -> bool:
    """Whether XLA's CPU code generation is held below the bfloat16 instructions
    (`--xla_cpu_max_isa` in `xla_flags`, default $XLA_FLAGS; e.g. benchmarks/hold_avx2.sh): XLA
    then emulates bfloat16 whatever the CPU has."""
    flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
    held = re.findall(r"--xla_cpu_max_isa=(\S+)", flags)
    return bool(held) and held[-1].upper() in ISAS_WITHOUT_BF16


def native_bf16(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (`NATIVE_BF16_FLAGS`) and XLA may use it
    (`held_below_bf16`): there a bfloat16 step is faster than a float32 one, elsewhere XLA
    emulates it and float32 is the faster."""
    return not held_below_bf16() and not cpu_flags(cpuinfo).isdisjoint(NATIVE_BF16_FLAGS)


def auto_bf16(on_accelerator: bool) -> bool:
    """The compute dtype "auto" as one rule for the Flax and the PyTorch paths
    (`embedder.resolve_dtype_name`, `torch_teacher.autocast_bf16`): bfloat16 on an accelerator
    and on a CPU that multiplies it in hardware (`native_bf16`), float32 on other CPUs."""
    return on_accelerator or native_bf16()
