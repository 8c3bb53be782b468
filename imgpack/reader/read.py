"""The read stage: a batch's records from the mapped packs into the batch's images.

One class per way a pack's records become a batch; the loader picks one when it is built
(``imgpack.reader.loader``):

``Gather``       raw and yuv420 records copied as stored into a canvas of the pack's slot
                 (``canvas.slot_shape``); a yuv420 batch stays yuv (half the bytes of RGB)
                 until a device stage converts it.
``Pixels``       records read as RGB pixels on the CPU into a canvas: yuv420 converted,
                 JPEG decoded (into the bound, or the canvas a ``plan.Scaled`` request sized
                 for the batch, each record at its scale).
``Encoded``      JPEG records left as their stored bytes, decoded on the device
                 (``device.DecodeOnDevice``).
``Crops``        each record read as pixels and its drawn crop resampled into an S x S slot
                 at once, in the same thread (``DeviceTransform.train``/``.eval`` on a CPU:
                 ``device.Normalise`` then only normalises).

A read fills a batch in parts shared out over ``threads`` threads (``threads.POOL``): row
ranges of the canvas, or runs of records to decode. From a pack not known to be in the
page cache each part is at most ``CHUNK_BYTES``, and every part checks ``stop`` before it
starts, so closing the loader never waits for a whole batch read from slow storage.

Every read stage is made as ``Stage(ds, Setup(...))``: where its buffers come from (an
allocator: ``inprocess.BufferPool``, reused only once the user holds nothing of them and
pinned for a CUDA device; ``SharedMemory`` in worker processes; ``resident.DeviceMemory``),
how many threads share a batch, whether slots are zeroed beyond each record, and, for a
resident pack, its device and the records it holds.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch.utils.data import get_worker_info

from imgpack.reader.batch import Batch
from imgpack.reader.canvas import slot_shape
from imgpack.reader.protocol import EncodedSource, PackedSource, PixelSource
from imgpack.reader.threads import POOL, check_threads

__all__ = [
    "CHUNK_BYTES",
    "Setup",
    "Allocator",
    "SharedMemory",
    "Gather",
    "Pixels",
    "Crops",
    "Encoded",
    "EncodedImages",
]

# From a pack that may be cold, a thread reads this much between checks for close().
CHUNK_BYTES = 4 << 20
_PARTS_PER_THREAD = 4  # decodes: parts of a few records each, so the threads balance


class Allocator(Protocol):
    def take(
        self, rows: int, shape: tuple[int, ...], bound: tuple[int, ...] | None = None
    ) -> tuple[torch.Tensor, np.ndarray]:
        """A (rows, *shape) uint8 buffer: (the tensor to hand out, a numpy view to fill).
        ``bound``: the largest ``shape`` this allocator's batches may have."""


class Setup(NamedTuple):
    """How a read stage is made (the module docstring). ``threads`` None: the CPUs this
    process may use (in a DataLoader worker: its share). ``pad``: zero each slot beyond its
    record (not needed by a transform that reads only each record's extent)."""

    alloc: Allocator
    threads: int | None = 1
    pad: bool = True
    device: Any = None
    held: Any = None


class SharedMemory:
    """Buffers for a batch read in a DataLoader worker: in shared memory from the start,
    so the batch crosses to the main process without another copy (in the main process,
    with ``num_workers=0``: plain memory)."""

    def take(
        self, rows: int, shape: tuple[int, ...], bound: tuple[int, ...] | None = None
    ) -> tuple[torch.Tensor, np.ndarray]:
        t = torch.empty((rows, *shape), dtype=torch.uint8)
        if t.numel() and get_worker_info() is not None:
            t.share_memory_()
        return t, t.numpy()


def _labels(ds: PackedSource, idx: np.ndarray, labels: np.ndarray) -> tuple:
    """The batch's (labels[, targets]) as tensors."""
    targets = ds.gather_targets(idx)
    out = torch.from_numpy(labels)
    return (out,) if targets is None else (out, targets)


def _rows_per_part(ds: PackedSource, n: int, row_bytes: int, parts: int) -> int:
    """Records per part: ``n`` split into ``parts``, each at most ``CHUNK_BYTES`` unless the
    pack is in the page cache."""
    rows = -(-n // max(1, parts))
    if not ds.in_page_cache:
        rows = min(rows, max(1, CHUNK_BYTES // max(1, row_bytes)))
    return max(1, rows)


def _filling(canvas: tuple[int, int], n: int) -> np.ndarray:
    """(w, h) of ``n`` records that each fill the canvas."""
    return np.tile(np.array([canvas[1], canvas[0]], dtype=np.int64), (n, 1))


def _run_parts(n: int, rows: int, work: Any, threads: int, stop: threading.Event | None):
    """``work(a, b)`` over [0, n) in parts of ``rows``, on ``threads`` threads."""
    starts = list(range(0, n, rows))
    POOL.run(len(starts), lambda k: work(starts[k], min(n, starts[k] + rows)), threads, stop)


class Gather:
    """raw and yuv420 records copied into a canvas of the pack's slot, zero beyond each."""

    def __init__(self, ds: PackedSource, setup: Setup) -> None:
        self.ds, self.alloc, self.threads = ds, setup.alloc, check_threads(setup.threads)
        self.slot = slot_shape(ds.codec, tuple(ds.shape))

    def __call__(self, batch: Batch, stop: threading.Event | None = None) -> Batch:
        ds, idx, n = self.ds, batch.records, len(batch.records)
        images, fill = self.alloc.take(n, self.slot)
        labels = np.empty(n, dtype=np.int64)

        def copy(a: int, b: int) -> None:
            ds.gather_into(idx[a:b], fill[a:b], labels[a:b])

        rows = _rows_per_part(ds, n, int(np.prod(self.slot)), self.threads)
        _run_parts(n, rows, copy, self.threads, stop)
        return batch.filled(images.permute(0, 3, 1, 2), _labels(ds, idx, labels))


class Pixels:
    """Records read as pixels on the CPU (yuv420 converted, JPEG decoded) into a canvas,
    each at the top-left of its slot.

    Without ``Setup.pad`` what lies beyond each record is left as it was, for a transform
    that reads only each record's extent (``device.ApplyDraw``)."""

    def __init__(self, ds: PixelSource, setup: Setup) -> None:
        self.ds, self.alloc, self.threads, self.pad = ds, setup.alloc, setup.threads, setup.pad
        self.bound = tuple(ds.shape)
        # yuv420 converts into channel planes at twice the speed of interleaved pixels
        # (``codec.yuv420_to_rgb``); JPEG decodes interleaved only
        self.planar = ds.codec == "yuv420"

    def __call__(self, batch: Batch, stop: threading.Event | None = None) -> Batch:
        ds, idx, n = self.ds, batch.records, len(batch.records)
        threads = check_threads(self.threads)
        (h, w), c = batch.hw, self.bound[2]
        if self.planar:  # (B, C, H, W), filled through its (B, H, W, C) view
            images, planes = self.alloc.take(n, (c, h, w), (c, *self.bound[:2]))
            fill = planes.transpose(0, 2, 3, 1)
        else:
            images, fill = self.alloc.take(n, (h, w, c), self.bound)
            images = images.permute(0, 3, 1, 2)
        labels = np.empty(n, dtype=np.int64)
        scales, pad = batch.scales, self.pad

        def decode(a: int, b: int) -> None:
            d = None if scales is None else scales[a:b]
            ds.decode_into(idx[a:b], fill[a:b], labels[a:b], d, 1, pad=pad)

        row_bytes = int(np.prod(fill.shape[1:]))
        rows = _rows_per_part(ds, n, row_bytes, threads * _PARTS_PER_THREAD)
        _run_parts(n, rows, decode, threads, stop)
        return batch.filled(images, _labels(ds, idx, labels))


class Crops:
    """Each record read as pixels and its crop (the batch's draw, in those pixels) resampled
    into an (S, S, C) slot, mirrored where drawn, in one pass of the same thread: uint8
    (B, C, S, S), channels last in memory."""

    def __init__(self, ds: PixelSource, setup: Setup) -> None:
        self.ds, self.alloc, self.threads = ds, setup.alloc, setup.threads
        self.channels = ds.shape[2]

    def __call__(self, batch: Batch, stop: threading.Event | None = None) -> Batch:
        ds, idx, n, draw = self.ds, batch.records, len(batch.records), batch.draw
        threads, size = check_threads(self.threads), draw.size
        images, fill = self.alloc.take(n, (size, size, self.channels))
        labels = np.empty(n, dtype=np.int64)

        def crop(a: int, b: int) -> None:
            ds.crops_into(idx[a:b], draw.crop[a:b], draw.flip[a:b], fill[a:b], labels[a:b],
                          None, 1)  # fmt: skip

        rows = _rows_per_part(ds, n, int(np.prod(ds.shape)), threads * _PARTS_PER_THREAD)
        _run_parts(n, rows, crop, threads, stop)
        return batch.filled(images.permute(0, 3, 1, 2), _labels(ds, idx, labels))


class EncodedImages(NamedTuple):
    """A batch's JPEG records before their decode on the device: each record's stored bytes
    (zero-copy views of the mapping), its region (None: the whole record), the channels,
    and for errors each record's name and (w, h) from the index."""

    buffers: list[np.ndarray]
    regions: np.ndarray | None
    channels: int
    names: list[str]
    sizes: np.ndarray


class Encoded:
    """JPEG records left encoded: the read slices each record's stored bytes, no pixel."""

    def __init__(self, ds: EncodedSource, setup: Setup) -> None:
        self.ds = ds  # no buffer, no thread, no padding: nothing is decoded here

    def __call__(self, batch: Batch, stop: threading.Event | None = None) -> Batch:
        ds, idx = self.ds, batch.records
        names = ds.record_names(idx)
        sizes = np.asarray(ds.record_sizes)[idx]
        images = EncodedImages(ds.encoded(idx), batch.regions, ds.shape[2], names, sizes)
        labels = np.ascontiguousarray(np.asarray(ds.labels)[idx], dtype=np.int64)
        return batch.filled(images, _labels(ds, idx, labels))
