"""Load-throughput measurement primitives for ``tune`` (and the benchmarks under scripts/).

Repeats reduced to medians (``Stat``); timing a window of batches with an
optional simulated step; peak memory of a process and its workers; and the page
cache: a cold measurement drops the pack's pages with ``posix_fadvise(DONTNEED)``
first (no root needed). Pages still mapped by a live process cannot be dropped,
so loaders are closed before, and ``cached_fraction`` (mincore) records what is
left.
"""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the reader (torch) is imported only by those who pass one
    from imgpack.reader.dataset import PackedImageDataset

__all__ = [
    "Stat",
    "stat",
    "drop_cache",
    "cached_fraction",
    "batch_len",
    "cycle_batches",
    "time_window",
    "close_loader",
    "PeakMemory",
]


@dataclass(frozen=True)
class Stat:
    """Repeated measurements of one quantity: report the median, show the spread."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def min(self) -> float:
        return min(self.samples) if self.samples else float("nan")

    @property
    def max(self) -> float:
        return max(self.samples) if self.samples else float("nan")

    def to_json(self) -> dict[str, Any]:
        return {
            "images_per_s": round(self.median, 1),
            "min": round(self.min, 1),
            "max": round(self.max, 1),
            "samples": [round(s, 1) for s in self.samples],
        }


def stat(samples: Iterable[float]) -> Stat:
    return Stat(tuple(float(s) for s in samples))


# --- the page cache -------------------------------------------------------------


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


def cached_fraction(path: str | os.PathLike) -> float | None:
    """Fraction of ``path``'s pages in the page cache (mincore), or None where unknown.

    Maps the file without touching it, so asking does not change the answer.
    """
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mincore = libc.mincore
    except (OSError, AttributeError):
        return None
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    mincore.restype = ctypes.c_int
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    try:
        view = np.frombuffer(mm, dtype=np.uint8)
        vec = np.zeros((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE, dtype=np.uint8)
        rc = mincore(view.ctypes.data, size, vec.ctypes.data)
        del view
        return None if rc != 0 else float((vec & 1).mean())
    finally:
        mm.close()


# --- timing loaders -----------------------------------------------------------------


def batch_len(batch: Any) -> int:
    labels = batch[1] if isinstance(batch, (tuple, list)) else batch
    return len(labels)


def cycle_batches(loader: Iterable) -> Iterator[Any]:
    """Batches forever, epoch after epoch (with persistent workers the seam is cheap)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("loader yields no batches (fewer images than one batch?)")


def time_window(
    batches: Iterator[Any],
    n: int | None = None,
    *,
    seconds: float | None = None,
    min_batches: int = 1,
    step_s: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[int, float, float]:
    """Take ``n`` batches (or batches for ``seconds``, at least ``min_batches``), "training"
    ``step_s`` on each; return (images, seconds, seconds spent waiting for batches).

    The step sleeps rather than spins: a GPU step leaves the host CPU free for the
    loader's workers, and a busy-wait would steal a core from them.
    """
    if n is None and seconds is None:
        raise ValueError("time_window needs n or seconds")
    images = count = 0
    waited, t0 = 0.0, clock()
    while True:
        elapsed = clock() - t0
        if n is not None and count >= n:
            break
        if seconds is not None and elapsed >= seconds and count >= min_batches:
            break
        t = clock()
        batch = next(batches)
        waited += clock() - t
        images += batch_len(batch)
        count += 1
        if step_s > 0:
            sleep(step_s)
    return images, clock() - t0, waited


def close_loader(loader: Any, dataset: PackedImageDataset | None = None) -> None:
    """Stop a loader's workers and unmap ``dataset`` now, not whenever the GC gets to them.

    A cold measurement needs this: the kernel will not drop pages that a live
    process still maps. torch has no public call that stops persistent workers,
    so this reaches for the DataLoader's iterator the way its own ``__del__`` does.
    """
    close = getattr(loader, "close", None)
    if callable(close):
        close()
    dl = getattr(loader, "dataloader", None) or loader
    it = getattr(dl, "_iterator", None)
    shutdown = getattr(it, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()
        dl._iterator = None
    if dataset is not None:
        dataset.close()
    gc.collect()


# --- memory -----------------------------------------------------------------------------


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
    pages): what a configuration really adds. Either is None where unavailable.
    """

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peak_rss: int | None = None
        self.peak_private: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import psutil
        except ImportError:
            self._me = None
        else:
            self._me = psutil.Process()
            self._gone = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)

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
        self._thread = threading.Thread(target=self._run, name="imgpack-peak-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sample()
