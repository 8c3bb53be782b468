"""Facts about this machine that both halves use (standard library only)."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

__all__ = ["usable_cores", "cpu_model", "machine_facts"]


def usable_cores() -> int:
    """The cores this process may run on: respects taskset, SLURM binding and cgroup CPU sets
    (not a Kubernetes CPU limit, which is a quota); all cores where affinity is unknown."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def cpu_model() -> str:
    """The CPU's marketing name (Linux /proc/cpuinfo), else what platform knows."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model
            )
    except OSError:
        return model


def machine_facts() -> dict[str, Any]:
    """What every benchmark records about the machine; each adds its own libraries."""
    return {
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "usable_cpus": usable_cores(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
