"""The read stage: a batch's records from the mapped packs into the batch's images, and
the one pool its buffers come from.

One class per way a pack's records become a batch; the loader's table picks one when it is
built (``imgpack.reader.loader``):

``Gather``  raw and yuv420 records copied as stored into a canvas of the pack's slot
            (``canvas.slot_shape``); a yuv420 batch stays yuv (half the bytes of RGB)
            until a device stage converts it.
``Pixels``  records read as RGB pixels on the CPU into a canvas: yuv420 converted, JPEG
            decoded (into the bound, or the canvas a ``plan.Scaled`` request sized for the
            batch, each record at its scale).
``Samples`` any dataset's samples, fetched as torch's DataLoader fetches them
            (``__getitems__``, else one ``ds[i]`` each) and collated: a dataset with a
            per-sample transform, or anyone's.
``Crops``   each record read as pixels and its drawn crop resampled into an S x S slot at
            once, in the same thread (``DeviceTransform.train``/``.eval`` on a CPU: the
            device stage then only normalises).

A read fills a batch in parts shared out over ``threads`` threads (``run.POOL``): row
ranges of the canvas, or runs of records to decode. From a pack not known to be in the
page cache each part is at most ``CHUNK_BYTES``, and every part checks ``stop`` before it
starts, so closing the loader never waits for a whole batch read from slow storage.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from imgpack.reader.canvas import slot_shape
from imgpack.reader.plan import Batch
from imgpack.reader.run import POOL, check_threads

__all__ = ["CHUNK_BYTES", "BufferPool", "Gather", "Pixels", "Crops", "Samples"]

# From a pack that may be cold, a thread reads this much between checks for close().
CHUNK_BYTES = 4 << 20
_PARTS_PER_THREAD = 4  # decodes: parts of a few records each, so the threads balance


@dataclass(eq=False)
class BufferPool:
    """Where every batch buffer comes from: a batch handed out is the user's until they
    drop it, so a buffer is reused only once nothing can reach it any more.

    ``limit`` > 0, on the CPU: each handed-out tensor wraps a fresh numpy view of a buffer,
    and a ``weakref.finalize`` on that view (which every tensor sharing the storage keeps
    alive) hands the buffer back when the last of them is gone. Up to ``limit``
    buffers handed back are kept (the oldest beyond go, so a shape no longer asked for
    drains away), and a batch takes the latest handed back that fits: the one still
    warmest in the caches, as a hand-written loop's one reused buffer is.
    Fresh from torch's allocators instead: pinned (``pin_memory``; its caching host
    allocator reuses a block only once every async copy out of it is done), on a GPU
    ``device`` (its caching allocator, by stream), ``limit=0``, and in a DataLoader worker
    (in shared memory from the start, so the batch crosses without another copy).
    """

    limit: int = 0
    pin_memory: bool = False
    dtype: torch.dtype = torch.uint8
    device: Any = None

    def __post_init__(self) -> None:
        self._free: list[np.ndarray] = []  # buffers handed back, the latest last
        self._lock = threading.RLock()  # a view's callback may run inside take(), in its thread
        self._np_dtype = torch.empty(0, dtype=self.dtype).numpy().dtype
        self.allocated = 0  # buffers made so far

    def __reduce__(self) -> tuple:  # to a worker process: the settings, no buffer
        return BufferPool, (self.limit, self.pin_memory, self.dtype, self.device)

    def take(
        self, rows: int, shape: tuple[int, ...], bound: tuple[int, ...] | None = None
    ) -> tuple[torch.Tensor, np.ndarray | None]:
        """A (rows, *shape) buffer: (the tensor to hand out, a numpy view of it to fill;
        None on a GPU). ``bound``: the largest ``shape`` batches may have (a canvas sized
        per batch): buffers are kept at the bound and reused for any shape within it."""
        if self.device is not None and self.device.type != "cpu":
            return torch.empty((rows, *shape), dtype=self.dtype, device=self.device), None
        if self.pin_memory or self.limit == 0:
            t = torch.empty((rows, *shape), dtype=self.dtype, pin_memory=self.pin_memory)
            if get_worker_info() is not None and t.numel():
                t.share_memory_()
            return t, t.numpy()
        keep = tuple(shape if bound is None else bound)
        with self._lock:
            free = self._free
            fits = (k for k in reversed(range(len(free))) if len(free[k]) >= rows)
            k = next((k for k in fits if free[k].shape[1:] == keep), None)
            base = None if k is None else free.pop(k)
        if base is None:
            self.allocated += 1
            # numpy's allocator asks for huge pages (torch's does not): a batch's writes
            # then miss the TLB far less, about a tenth of a copy's time
            base = np.empty((rows, *keep), dtype=self._np_dtype)
        view = base.reshape(-1)[: rows * math.prod(shape)].reshape(rows, *shape)
        weakref.finalize(view, self._back, base)  # the view's death hands base back
        return torch.from_numpy(view), view

    def _back(self, base: np.ndarray) -> None:
        with self._lock:
            self._free.append(base)
            del self._free[: -self.limit]


class Gather:
    """raw and yuv420 records copied into a canvas of the pack's slot, zero beyond each.

    The one shape of a read stage: a buffer from the pool, its parts filled (``_fill``) on
    ``threads`` threads (None: the usable cores, or a worker's share), then the labels and
    targets beside it. A copy is memory-bound (``copies``): the loader gives it one or two
    threads, not every core, and one part per thread."""

    copies = True

    def __init__(self, ds: Any, pool: BufferPool, threads: int | None, pad: bool = True):
        self.ds, self.pool, self.threads, self.pad = ds, pool, threads, pad
        self.slot = slot_shape(ds.codec, tuple(ds.shape))
        self.chunk = max(1, CHUNK_BYTES // math.prod(self.slot))  # records per part, if cold

    def __call__(self, batch: Batch, stop: threading.Event | None = None) -> Batch:
        ds, idx, n = self.ds, batch.records, len(batch.records)
        threads = check_threads(self.threads)
        images, fill = self.pool.take(n, *self._canvas(batch))
        labels = np.empty(n, dtype=np.int64)
        rows = max(1, -(-n // (threads if self.copies else threads * _PARTS_PER_THREAD)))
        if not ds._in_page_cache:  # from a pack that may be cold: check stop often
            rows = min(rows, self.chunk)
        if ds._run.pin_bytes is not None:  # a remote pack's blocks, a few at a time
            rows = max(1, min(rows, ds._run.pin_bytes // threads // math.prod(self.slot)))

        def part(k: int) -> None:
            a, b = k * rows, min(n, (k + 1) * rows)
            with ds._run.fetched(idx[a:b]):  # a remote pack's blocks (imgpack.remote)
                self._fill(batch, fill[a:b], labels[a:b], a, b)

        POOL.run(-(-n // rows), part, threads, stop)
        targets = ds._gather_targets(idx)
        rest = (torch.from_numpy(labels),) + (() if targets is None else (targets,))
        return batch.filled(images.permute(0, 3, 1, 2), rest)

    __getitem__ = __call__  # read[request]: in a DataLoader's workers (run.Workers)

    def _canvas(self, batch: Batch) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
        """(h, w, C) of each slot of the batch, and the largest a slot may be
        (``BufferPool.take``'s ``bound``)."""
        return self.slot, None

    def _fill(self, batch: Batch, fill: np.ndarray, labels: np.ndarray, a: int, b: int):
        self.ds._run.copy(batch.records[a:b], fill, labels)


class Pixels(Gather):
    """Records read as pixels on the CPU (yuv420 converted, JPEG decoded) into a canvas,
    each at the top-left of its slot. Without ``pad`` what lies beyond each record is left
    as it was, for a transform that reads only each record's extent."""

    copies = False

    def _canvas(self, batch: Batch) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
        # rows of pixels for every codec: yuv420 converts fastest into them too
        # (``codec.yuv420_to_rgb``)
        return (*batch.hw, self.ds.shape[2]), tuple(self.ds.shape)  # within the pack's bound

    def _fill(self, batch: Batch, fill: np.ndarray, labels: np.ndarray, a: int, b: int):
        d = None if batch.scales is None else batch.scales[a:b]
        self.ds._run.pixels(batch.records[a:b], fill, labels, d, self.pad)


class Crops(Gather):
    """Each record read as pixels and its crop (the batch's draw, in those pixels) resampled
    into an (S, S, C) slot, mirrored where drawn, in one pass of the same thread: uint8
    (B, C, S, S), channels last in memory."""

    copies = False

    def _canvas(self, batch: Batch) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
        return (batch.draw.size, batch.draw.size, self.ds.shape[2]), None

    def _fill(self, batch: Batch, fill: np.ndarray, labels: np.ndarray, a: int, b: int):
        draw = batch.draw
        self.ds._run.crops(batch.records[a:b], draw.crop[a:b], draw.flip[a:b], fill, labels)


class Samples:
    """A batch of any dataset's samples, fetched as torch's DataLoader fetches them and
    collated by ``collate``: images first, the rest after; anything else is handed over as
    ``collate`` made it."""

    def __init__(self, ds: Any, collate: Any) -> None:
        self.ds, self.collate = ds, collate

    def __call__(self, batch: Batch, stop: threading.Event | None = None) -> Batch:
        idx, many = batch.records.tolist(), getattr(self.ds, "__getitems__", None)
        out = self.collate(many(idx) if many else [self.ds[i] for i in idx])
        if isinstance(out, (tuple, list)) and out:
            return batch.filled(out[0], tuple(out[1:]))
        return batch.filled(out, None)

    __getitem__ = __call__  # read[request]: in a DataLoader's workers (run.Workers)
