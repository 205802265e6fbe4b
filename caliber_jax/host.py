"""What this host lets the process use; imports nothing heavy, so PyTorch-only scripts share it."""

import os


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (taskset, cgroup cpusets, Slurm), which
    `os.cpu_count()` ignores."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS: no affinity API
        return os.cpu_count() or 1
