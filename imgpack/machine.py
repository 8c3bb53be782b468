"""Facts about this machine that both halves use (standard library only)."""

from __future__ import annotations

import os

__all__ = ["usable_cores", "mem_available"]


def usable_cores() -> int:
    """The cores this process may run on: respects taskset, SLURM binding and cgroup CPU sets
    (not a Kubernetes CPU limit, which is a quota); all cores where affinity is unknown."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _number(path: str, key: str | None = None) -> int | None:
    """The integer that is ``path``'s whole text, or that follows ``key`` on its line of
    ``path`` ("key number [unit]"); None where there is none ("max": cgroup v2's no limit)."""
    try:
        with open(path, encoding="ascii") as f:
            if key is None:
                return int(f.read())
            return next((int(ln.split()[1]) for ln in f if ln.split()[:1] == [key]), None)
    except (OSError, ValueError, IndexError):
        return None


def _cgroup_room() -> int | None:
    """Bytes this process's memory cgroup may still fill (its limit, less what it holds that
    the kernel cannot drop: page cache counts as room), or None without a limit.

    A container's /proc/meminfo shows the host's memory: a 1 GiB container on a 256 GiB
    host must not warm a 100 GB pack. cgroup v2 only (the ``0::`` line names the process's
    group; a cgroup namespace shows its own root): v1 hierarchies have no ``memory.max``
    and read as no limit.
    """
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            own = next((ln[3:].strip() for ln in f if ln.startswith("0::")), "")
    except OSError:
        return None
    for folder in ("/sys/fs/cgroup" + own.rstrip("/"), "/sys/fs/cgroup"):
        limit = _number(os.path.join(folder, "memory.max"))
        used = _number(os.path.join(folder, "memory.current"))
        if limit is not None and used is not None:
            held = used - (_number(os.path.join(folder, "memory.stat"), "file") or 0)
            return max(0, limit - max(0, held))
    return None


def mem_available() -> int | None:
    """Bytes of memory this process could still fill, page cache included: the smaller of
    MemAvailable (/proc/meminfo) and its memory cgroup's room; None where neither is known."""
    kib = _number("/proc/meminfo", "MemAvailable:")
    known = [n for n in (None if kib is None else kib * 1024, _cgroup_room()) if n is not None]
    return min(known) if known else None
