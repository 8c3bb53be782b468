"""Facts about this machine that both halves use (standard library only)."""

from __future__ import annotations

import os

__all__ = ["usable_cores"]


def usable_cores() -> int:
    """The cores this process may run on: respects taskset, SLURM binding and cgroup CPU sets
    (not a Kubernetes CPU limit, which is a quota); all cores where affinity is unknown."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1
