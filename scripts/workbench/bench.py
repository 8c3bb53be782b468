"""The physical limits a loader is measured against, and timing a whole epoch.

Used by the load benchmark (``bench_run``); the primitives ``tune`` also needs
live in the package, in ``imgpack.diagnose.measure``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

import numpy as np

from imgpack.diagnose.measure import Stat, batch_len, cached_fraction, drop_cache, stat

__all__ = ["memcpy_images_per_s", "fromfile_images_per_s", "time_epoch"]


def memcpy_images_per_s(
    record_bytes: int, *, nbytes: int = 512 << 20, repeats: int = 3, clock=time.perf_counter
) -> Stat:
    """Single-thread copy bandwidth of a warm buffer, in records per second."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros_like(src)
    np.copyto(dst, src)  # warm-up: both buffers faulted in, caches primed
    rates = []
    for _ in range(repeats):
        t0 = clock()
        np.copyto(dst, src)
        rates.append(nbytes / (clock() - t0) / record_bytes)
    return stat(rates)


def fromfile_images_per_s(
    data_path: str | os.PathLike,
    record_bytes: int,
    *,
    cold: bool,
    repeats: int = 3,
    clock=time.perf_counter,
) -> tuple[Stat, float | None]:
    """Read the whole .bin with one np.fromfile; bytes/s as records/s. Returns (stat, cached)."""
    size = os.path.getsize(data_path)
    if not cold:
        np.fromfile(data_path, dtype=np.uint8)  # warm-up: pulls the file into the cache
    rates, cached = [], None
    for _ in range(repeats):
        if cold:
            drop_cache(data_path)
            cached = cached_fraction(data_path)
        t0 = clock()
        arr = np.fromfile(data_path, dtype=np.uint8)
        rates.append(size / (clock() - t0) / record_bytes)
        del arr
    return stat(rates), cached


def time_epoch(loader: Iterable, *, clock=time.perf_counter) -> tuple[int, float]:
    """(images, seconds) for one full pass over ``loader``."""
    n, t0 = 0, clock()
    for batch in loader:
        n += batch_len(batch)
    return n, clock() - t0
