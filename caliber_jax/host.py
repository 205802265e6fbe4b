"""What this host lets the process use; imports nothing heavy, so PyTorch-only scripts share it."""

import os


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
