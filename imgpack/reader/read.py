"""The plan and read stages, and ``Batch``, the one type a batch has on its way through the
loader's stages.

The plan makes a ``Batch`` (which records, in what canvas, with the crops drawn for them),
the read stage fills it (images, labels, targets), the device stages replace its images,
and ``output`` gives the user their tuple. A ``Batch`` crosses from worker processes as it
is (its tensors through shared memory); torch's DataLoader pins it through its
``pin_memory`` method, the hook torch documents for custom batch types.

**The plan.** ``Plan`` is the epoch order (``imgpack.reader.order``) as a torch sampler whose
items are whole batches: each batch's records as a ``Batch`` request (a DataLoader built
with ``batch_size=None`` hands each to its dataset, and frameworks that set the epoch on
``loader.sampler`` find ``set_epoch`` here). With ``DeviceTransform.train``/``.eval`` it also
draws the batch's crops first (``DeviceTransform.draw``), which the read stage needs before
it reads:

``Drawn``    the crops in record pixels; the records are read whole (raw and yuv420 packs).
``Scaled``   a JPEG record is decoded at the largest DCT scale (``jpeg.pick_scales``) that
             still leaves its crop ``jpeg.GAP`` times the output, into a canvas just large
             enough for the batch; the draw is moved into decoded pixels (decoded pixel x'
             shows record pixels [x' d, (x' + 1) d): ``jpeg.scaled_size``).

Every random draw the loader applies (the crops of ``DeviceTransform.train``, the windows
and flips of a ``DeviceTransform`` built with ``crop=`` or ``flip=``) comes from the batch's
own generator (``Batch.generator``), seeded from (``draw_seed``, rank, epoch, batch), where
``draw_seed`` is one number drawn when the loader is built (``Plan.seed_draws``), from the
transform's generator, else from ``make_loader``'s ``seed=``, else from torch's. So the
draws, like the order, are a pure function of the batch's place in the run: they depend on
neither the device, the pack's codec, the thread or process that reads the batch, nor when
it does; ``seed=`` or ``torch.manual_seed`` reproduces a run, in-process, workers and
resident loaders give the same batches, and a run resumed from ``loader.state_dict()`` draws
what it would have drawn. The rank is in the seed because ranks are usually seeded alike:
without it, batch k of every rank would get the same boxes and flips.

**The read.** One class per way a pack's records become a batch, and the one pool its
buffers come from (``BufferPool``); the loader's table picks one when it is
built (``imgpack.reader.loader``):

``Gather``  raw and yuv420 records copied as stored into a canvas of the pack's slot
            (``canvas.slot_shape``); a yuv420 batch stays yuv (half the bytes of RGB)
            until a device stage converts it.
``Pixels``  records read as RGB pixels on the CPU into a canvas: yuv420 converted, JPEG
            decoded (into the bound, or the canvas a ``Scaled`` request sized for the
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
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler, get_worker_info

from imgpack.reader.canvas import slot_shape
from imgpack.reader.jpeg import pick_scales, scaled_size
from imgpack.reader.order import EpochOrder
from imgpack.reader.run import POOL, check_threads

__all__ = ["Batch", "Plan", "Drawn", "Scaled", "pinned", "tree_map"]  # the plan
__all__ += ["CHUNK_BYTES", "BufferPool", "Gather", "Pixels", "Crops", "Samples"]  # the read

_DRAWS = 1  # the loader's seed feeds the order as it is; the draws take this stream of it


@dataclass
class Batch:
    """One batch between two stages.

    ``records``: int64 (B,), the dataset positions. ``hw``: (H, W) that the images are laid
    out in (the pack's bound, or a smaller canvas a plan sized for this batch).
    ``draw``: the crops drawn before reading (``DeviceTransform.draw``), in the pixels of
    ``images``; ``scales``: each JPEG record's DCT scale denominator.
    ``images``: what the last stage left (a canvas tensor, a yuv canvas, RGB on the
    device ...). ``rest``: what follows the images in the
    user's tuple (labels[, targets]); None when ``images`` is a collated batch to hand over
    as it is. ``sizes``: int64 (B, 2), (w, h) of each record's pixels at the top-left of its
    slot in ``images``; None when every record fills the canvas. ``seed``: the seed of the
    batch's random draws (``generator``); None where the loader's transform draws nothing at
    random.
    """

    records: np.ndarray
    hw: tuple[int, int]
    draw: Any = None  # a transform.Draw (transform imports this module)
    scales: np.ndarray | None = None
    images: Any = None
    rest: tuple | None = ()
    sizes: np.ndarray | None = None
    seed: int | None = None

    def generator(self) -> torch.Generator | None:
        """A generator of this batch's random draws, the same wherever and whenever it is
        made (None where the batch has no ``seed``)."""
        return None if self.seed is None else torch.Generator().manual_seed(self.seed)

    def filled(self, images: Any, *rest: Any) -> Batch:
        """This batch, now holding ``images`` (and ``rest``, where given: a read stage's
        labels[, targets], or None for a collated batch): a batch has one owner at a time,
        the stage it is in."""
        self.images = images
        self.rest = rest[0] if rest else self.rest
        return self

    def pin_memory(self) -> Batch:
        """Every tensor of the batch page-locked (torch's DataLoader calls this)."""
        return replace(self, images=pinned(self.images), rest=pinned(self.rest))

    def output(self) -> Any:
        """What the user's loop receives: (images, labels[, targets])."""
        return self.images if self.rest is None else (self.images, *self.rest)


def tree_map(fn: Any, obj: Any) -> Any:
    """``obj`` with every tensor in it replaced by ``fn(tensor)``: tuples (named ones too),
    lists and dicts are walked, anything else comes back as it is."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (tuple, list)):  # a named tuple takes its fields one by one
        items = [tree_map(fn, o) for o in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, dict):
        return {k: tree_map(fn, v) for k, v in obj.items()}
    return obj


def pinned(obj: Any) -> Any:
    """``obj`` with every tensor in it page-locked, as torch's pin thread does."""
    return tree_map(lambda t: t if t.is_pinned() else t.pin_memory(), obj)


class Drawn:
    """The transform's crops of each batch, in record pixels, over records read whole."""

    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __call__(self, batch: Batch) -> Batch:
        batch.draw = self.transform.draw(batch.records, batch.hw, generator=batch.generator())
        return batch


class Scaled(Drawn):
    """JPEG records each decoded at the scale its crop needs (module docstring)."""

    def __call__(self, batch: Batch) -> Batch:
        draw = self.transform.draw(batch.records, batch.hw, generator=batch.generator())
        scales = pick_scales(draw.crop, draw.size, draw.size)
        w, h = scaled_size(draw.sizes[:, 0], draw.sizes[:, 1], scales)
        batch.draw = draw._replace(crop=draw.crop / scales[:, None], sizes=np.stack([w, h], 1))
        batch.hw = (int(h.max()), int(w.max())) if len(w) else (1, 1)  # the smallest canvas
        batch.scales, batch.sizes = scales, batch.draw.sizes
        return batch


@dataclass(eq=False)
class Plan(Sampler):
    """Each batch of the order's pass as a ``Batch`` request (see the module docstring).

    ``begin()`` starts a pass; every ``iter()`` until the next ``begin`` yields
    the same batches (a DataLoader makes its sampler's iterator twice when it starts its
    workers). ``draws``: None (the records, in the pack's ``bound`` canvas, each of its
    ``record_sizes``: int64 (N, 2), or None where every record fills the bound), or
    ``Drawn`` or ``Scaled``. ``draw_seed`` (``seed_draws``): where the transform draws at
    random, every batch gets its ``seed``; None where it draws nothing at random.
    """

    order: EpochOrder
    bound: tuple[int, int]
    draws: Drawn | None
    record_sizes: np.ndarray | None = None
    draw_seed: int | None = None
    epoch: int = 0  # the pass's, from ``begin``
    start: int = 0

    @staticmethod
    def seed_draws(seed: int | None, generator: torch.Generator | None) -> int:
        """The ``draw_seed`` of a loader whose transform draws at random (module docstring):
        from the transform's ``generator``, else the loader's ``seed``, else torch's."""
        if generator is None and seed is not None:  # the draws' own stream of the loader's seed
            state = np.random.SeedSequence((seed, _DRAWS)).generate_state(1, np.uint64)
            return int(state[0] >> np.uint64(1))
        where = generator.device if generator is not None else torch.device("cpu")
        return int(torch.randint(0, 2**63 - 1, (1,), generator=generator, device=where))

    def __len__(self) -> int:
        return len(self.order)

    def begin(self) -> tuple[int, int]:
        """Start the order's next pass (``EpochOrder.begin_pass``): the epoch and first batch
        of every ``iter()`` until the next ``begin``."""
        self.epoch, self.start = self.order.begin_pass()
        return self.epoch, self.start

    def set_epoch(self, epoch: int) -> None:
        """``PackLoader.set_epoch``, for frameworks that set the epoch on ``loader.sampler``.

        Lightning does, each epoch; without it a run resumed from an epoch-end checkpoint
        (whose loader state Lightning does not reload) replayed epoch 0's order.
        """
        self.order.set_epoch(epoch)

    def _seed(self, epoch: int, batch: int) -> int | None:
        """The ``Batch.seed`` of batch ``batch`` of ``epoch`` (module docstring)."""
        if self.draw_seed is None:
            return None
        entropy = np.random.SeedSequence((self.draw_seed, self.order.rank, epoch, batch))
        return int(entropy.generate_state(1, np.uint64)[0])

    def __iter__(self) -> Iterator[Batch]:
        sizes, epoch = self.record_sizes, self.epoch
        for k, idx in enumerate(self.order.batches(epoch, self.start), self.start):
            own = None if sizes is None else sizes[idx]  # (idx: int64 already)
            batch = Batch(idx, self.bound, sizes=own, seed=self._seed(epoch, k))
            yield batch if self.draws is None else self.draws(batch)


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
        with self._lock:  # the latest handed back that holds ``rows`` of ``keep``
            fits = (k for k in reversed(range(len(self._free))) if len(self._free[k]) >= rows)
            k = next((k for k in fits if self._free[k].shape[1:] == keep), None)
            base = None if k is None else self._free.pop(k)
        if base is None:
            self.allocated += 1
            # numpy's allocator asks for huge pages (torch's does not): a batch's writes
            # then miss the TLB far less, about a tenth of a copy's time
            base = np.empty((rows, *keep), dtype=torch.empty(0, dtype=self.dtype).numpy().dtype)
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

    def __call__(self, batch: Batch, stop: threading.Event | None = None) -> Batch:
        ds, idx, n = self.ds, batch.records, len(batch.records)
        threads = check_threads(self.threads)
        images, fill = self.pool.take(n, *self._canvas(batch))
        labels = np.empty(n, dtype=np.int64)
        rows = max(1, -(-n // (threads if self.copies else threads * _PARTS_PER_THREAD)))
        if not ds._in_page_cache:  # from a pack that may be cold: check stop often
            rows = min(rows, max(1, CHUNK_BYTES // math.prod(self.slot)))
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
