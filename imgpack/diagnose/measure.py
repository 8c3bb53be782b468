"""What ``tune`` measures with: repeats reduced to medians, a window of batches timed by the
meter, the page cache dropped for a cold run, and the peak memory of a process and its workers.

A cold measurement drops the pack's pages with ``posix_fadvise(DONTNEED)`` first (no root
needed). Pages still mapped by a live process cannot be dropped, so a loader and its
dataset are closed before. Nothing here imports torch.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from imgpack.diagnose.meter import watch

__all__ = ["Stat", "stat", "drop_cache", "batches_forever", "window", "PeakMemory"]


@dataclass(frozen=True)
class Stat:
    """Repeated measurements of one quantity: report the median, show the spread."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def min(self) -> float:
        return min(self.samples, default=float("nan"))

    @property
    def max(self) -> float:
        return max(self.samples, default=float("nan"))


def stat(samples: Iterable[float]) -> Stat:
    return Stat(tuple(float(s) for s in samples))


def drop_cache(path: str | os.PathLike) -> bool:
    """Ask the kernel to forget ``path``'s cached pages; False where the platform cannot."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages are never dropped; a finished pack has none, but be sure
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def batches_forever(loader: Iterable) -> Iterator[Any]:
    """Batches epoch after epoch (with persistent workers the seam is cheap)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("loader yields no batches (fewer images than one batch?)")


def window(
    batches: Iterator[Any],
    *,
    seconds: float,
    min_batches: int = 1,
    step_s: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, float]:
    """Batches for ``seconds`` (at least ``min_batches``), "training" ``step_s`` on each,
    through the meter; (images/s, the share of the time spent waiting), first batch included.

    The step sleeps rather than spins: a GPU step leaves the host CPU free for the
    loader's workers, and a busy-wait would steal a core from them.
    """
    end = clock() + seconds

    def until() -> Iterator[Any]:
        for n, batch in enumerate(batches, 1):
            yield batch
            if n >= min_batches and clock() >= end:
                return

    watched = watch(until(), log=lambda line: None, progress=False, clock=clock)
    for _ in watched:
        time.sleep(step_s)
    s = watched.summary()
    took = s.seconds + s.first_batch_s
    return (s.images + s.first_batch_images) / took, (s.wait_s + s.first_batch_s) / took


def _private_bytes(pid: int) -> int | None:
    """Anonymous + shared-memory PSS of ``pid`` (Linux smaps_rollup), or None where unknown.

    PSS splits a page shared by k processes k ways, so summing over a parent and
    its forked workers counts each page once; file pages (the mapped pack, the
    libraries) are left out because the page cache holds them for everyone.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f if line[:4] == "Pss_")
        return (int(fields["Pss_Anon"].split()[0]) + int(fields["Pss_Shmem"].split()[0])) * 1024
    except (OSError, KeyError, ValueError):
        return None


class PeakMemory:
    """Peak memory of this process and its children, sampled in a thread while in use.

    ``peak_rss``: RSS summed over the processes, as psutil reports it (pages shared
    by forked workers and the mapped pack are counted once per process).
    ``peak_private``: anonymous + shared-memory PSS summed (each page once, no file
    pages): what a configuration really adds. Either is None where unavailable
    (psutil, the dev extra's, lists the worker processes).
    """

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peak_rss: int | None = None
        self.peak_private: int | None = None
        self._stop = threading.Event()
        try:
            import psutil
        except ImportError:
            self._me = None
        else:
            self._me = psutil.Process()
            self._gone = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)
        self._thread = threading.Thread(target=self._run, name="imgpack-peak-memory", daemon=True)

    def sample(self) -> None:
        if self._me is None:
            return
        rss, private = 0, 0
        try:
            procs = [self._me, *self._me.children(recursive=True)]
        except self._gone:
            return
        for p in procs:
            try:
                rss += p.memory_info().rss
            except self._gone:
                continue
            priv = _private_bytes(p.pid)
            private = None if priv is None or private is None else private + priv
        self.peak_rss = max(self.peak_rss or 0, rss)
        if private is not None:
            self.peak_private = max(self.peak_private or 0, private)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> PeakMemory:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()
