"""The in-process fast path: a background thread gathers each batch while the step runs.

A packed dataset needs no decoding, so a batch is just a gather of records from the
mapped file. Worker processes would only add cost: every batch crosses a process
boundary through shared memory and is copied again. Here a thread calls
``ds.gather_into`` while the training step runs; numpy releases the GIL during large
copies, so the two overlap. With ``threads > 1``, a batch is split into row ranges
gathered at once by helper threads: one thread copying random 150 KB records reaches about
half of memcpy bandwidth, two reach nearly all of it (docs/benchmarks.md). A batch
gathered while the queue is already full (``prefetch`` batches wait for the consumer)
takes one thread, which leaves the other cores to the consumer's own torch threads.

The threads are stopped and joined before the interpreter exits
(``imgpack.reader.threads``), so a script that ends holding an iterator exits cleanly;
while the consumer waits for a batch, the page-cache warm pauses (``warm.DEMAND``).

A batch handed out belongs to the user: buffers come from ``buffers.BufferPool``, which
reuses one only when nothing references it any more.

A JPEG pack's records are decoded, not copied: on ``threads`` threads of the decode pool
(``imgpack.reader.decodepool``), and, for a plan of ``scaled.Planned`` batches, each at its
own scale into a canvas sized for the batch (a buffer of the bound, reused). With
``packed=True`` (a batch bound for a CUDA device) they are decoded end to end into the
front of that buffer instead, handed on as a ``packed.Packed`` batch that the delivery lays
out as the canvas on the device. With ``gpu=True`` they are not decoded here at all: the
batch's images are an ``devdecode.Encoded`` batch (the stored bytes, and each record's
region for a ``Planned`` batch) that the delivery decodes on the device.

Each item yielded is ``(batch, records)``: the batch tuple (images, labels[, targets]),
or what ``collate`` made of per-sample work, and the int64 record indices it holds (for a
``Planned`` batch, its draw in decoded pixels, which carries them).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any, Callable

import numpy as np
import torch

from imgpack.errors import InvalidArgumentError, LoaderError
from imgpack.reader.background import CLOSED, Run
from imgpack.reader.buffers import BufferPool
from imgpack.reader.devdecode import Encoded
from imgpack.reader.options import _int_at_least
from imgpack.reader.packed import Packed, Rows
from imgpack.reader.protocol import PackedSource, decodes_jpeg
from imgpack.reader.scaled import Planned
from imgpack.reader.warm import DEMAND
from imgpack.reader.yuv import canvas_shape

__all__ = ["InProcessLoader", "DEFAULT_PREFETCH", "INLINE_BYTES"]

DEFAULT_PREFETCH = 2  # batches gathered ahead of the consumer
# A batch smaller than this is gathered in the caller's thread: copying 1 MiB takes about
# as long as handing a batch between threads (wake-ups, the GIL), and a background thread
# also takes a core from the consumer's own torch threads. Measured in docs/benchmarks.md.
INLINE_BYTES = 1 << 20
# pooled buffers beyond ``prefetch`` (the queue): the one being gathered, the one in the
# user's loop, the one before it (still bound while the next is fetched), and one spare
_SPARE = 4


class InProcessLoader:
    """(batch, records) pairs gathered by a background thread (and ``threads - 1`` helpers).

    ``plan`` is any re-iterable of index arrays (one per batch), or of ``Planned`` batches of
    a JPEG pack, iterated once per pass.
    Only one pass runs at a time: starting a new one stops the previous one. ``collate``
    set means per-sample work: each batch is ``collate`` of the samples at ``indices``.
    """

    def __init__(
        self,
        dataset: Any,
        plan: Iterable[Any],
        *,
        prefetch: int = DEFAULT_PREFETCH,
        pin_memory: bool = False,
        hints: bool | None = None,
        timeout: float | None = None,
        threads: int = 1,
        collate: Callable[[list], Any] | None = None,
        gpu: bool = False,
        packed: bool = False,
    ) -> None:
        _int_at_least("prefetch", prefetch, 1, none_ok=False)
        _int_at_least("threads", threads, 1, none_ok=False)
        if timeout is not None and not timeout > 0:
            raise InvalidArgumentError(f"timeout should be > 0 seconds or None, found {timeout!r}")
        whole = isinstance(dataset, PackedSource)  # else: per-sample work, no read-ahead hints
        if collate is None and not whole:
            raise InvalidArgumentError(
                f"in-process mode needs a dataset with gather_into(), not {type(dataset).__name__}"
            )
        if pin_memory and not torch.cuda.is_available():
            raise InvalidArgumentError("pin_memory=True needs CUDA, which this torch build lacks")
        self.dataset, self.plan, self.collate = dataset, plan, collate
        self.prefetch, self.threads, self.timeout = prefetch, threads, timeout
        self.pin_memory, self.hints = bool(pin_memory), hints if whole else False
        self.buffers = BufferPool(prefetch + _SPARE, pin_memory=self.pin_memory)
        # one record's slot in a batch buffer: (H, W, C), or a yuv420 pack's canvas rows
        self.slot = canvas_shape(dataset.codec, tuple(dataset.shape)) if whole else None
        # a JPEG pack's records are decoded on ``threads`` threads of the decode pool
        self.decodes = decodes_jpeg(dataset)
        self.gpu = bool(gpu) and self.decodes  # images left encoded for the device
        self.packed = bool(packed) and self.decodes and not self.gpu  # laid out there
        self._active: Run | None = None
        self._passes = 0  # close() calls: the pass under way is the one begun after the last

    def close(self) -> None:
        """Stop the pass under way, if any (its iterator then raises LoaderError)."""
        self._passes += 1  # an in-thread pass sees this at its next batch
        if self._active is not None:
            self._active.close()
            self._active = None

    def hint(self, idx: Any) -> None:
        """MADV_WILLNEED on a batch's records: its reads then run in parallel, not one per
        page fault. ``hints=None``: only until the pack is known to be in the page cache."""
        ds, hints = self.dataset, self.hints
        if hints is False or (hints is None and ds.resident):
            return
        ds.will_need(np.asarray(idx))

    def copy(
        self, idx: np.ndarray, images: Any, labels: np.ndarray, scales: Any, threads: int
    ) -> None:
        """Records ``idx`` into ``images``/``labels``: copied, or decoded (at ``scales``);
        ``images`` a canvas, or ``packed.Rows``."""
        if isinstance(images, Rows):
            self.dataset.decode_into(idx, images.flat, labels, scales, threads)
        elif self.decodes:  # scales: a Planned batch, whose transform reads only each extent
            self.dataset.decode_into(idx, images, labels, scales, threads, pad=scales is None)
        else:
            self.dataset.gather_into(idx, images, labels)

    def batch(self, item: Any, gather: Callable[..., bool]) -> tuple[torch.Tensor, ...] | None:
        """The batch ``item`` (indices, or a ``Planned`` batch), filled by ``gather(idx,
        images, labels, scales)`` into a free buffer (None: stopped)."""
        ds = self.dataset
        idx, planned = _split(item)
        if self.gpu:
            return self._encoded(idx, planned)
        c, hw = self.slot[2], self.slot[:2] if planned is None else planned.canvas
        if self.packed:  # the records end to end: pinned, only their bytes
            sizes = np.asarray(ds.record_sizes)[idx] if planned is None else planned.draw.sizes
            rows = Rows.of(None, sizes, c)
            if self.pin_memory:
                images, fill = self.buffers.take(1, (rows.nbytes,))
            else:  # a reused canvas-sized buffer, its front
                images, fill = self.buffers.take(idx.size, (*hw, c), self.slot)
            images, fill = images.reshape(-1)[: rows.nbytes], rows.over(fill.reshape(-1))
        else:  # a canvas just large enough for the batch's (decoded) records
            images, fill = self.buffers.take(idx.size, (*hw, c), self.slot)
        labels = np.empty(idx.size, dtype=np.int64)
        if not gather(idx, fill, labels, None if planned is None else planned.scales):
            return None
        if self.packed:
            images = Packed(images, sizes, tuple(hw), c)
        else:
            images = images.permute(0, 3, 1, 2)  # (B,C,H,W), channels_last in memory
        batch: tuple[Any, ...] = (images, torch.from_numpy(labels))
        targets = ds.gather_targets(idx)
        if targets is not None:
            batch = (*batch, targets)
        if self.pin_memory:
            batch = (batch[0], *(t.pin_memory() for t in batch[1:]))
        return batch

    def _encoded(self, idx: np.ndarray, planned: Planned | None) -> tuple[Any, ...]:
        """The batch with its images left as an ``Encoded`` batch (decoded on the device)."""
        ds = self.dataset
        if planned is None:
            images = Encoded.of(ds, idx, None, self.slot[:2])
        else:
            images = Encoded.of(ds, idx, planned.regions, planned.canvas)
        batch = (images, torch.from_numpy(np.asarray(ds.labels)[idx].astype(np.int64)))
        targets = ds.gather_targets(idx)
        batch = batch if targets is None else (*batch, targets)
        return batch if not self.pin_memory else (images, *(t.pin_memory() for t in batch[1:]))

    def _gather_here(
        self, idx: np.ndarray, images: np.ndarray, labels: np.ndarray, scales: Any
    ) -> bool:
        with DEMAND.waiting():  # the loop asked for this batch: no warm chunk goes first
            self.copy(idx, images, labels, scales, self.threads)
        return True

    def announced(
        self, plan: Iterator[Any], fetch: Callable[[Any], Any]
    ) -> Iterator[tuple[Any, Any]]:
        """(fetch(item), records) for each batch of ``plan``, each batch's reads announced
        (``hint``) before the batch ahead of it is gathered, so that they overlap; only the
        first batch's reads go out alone, so that it waits for nothing else. Ends early when
        ``fetch`` returns None (stopped). ``records``: the int64 indices as a tensor, or a
        ``Planned`` batch's draw."""
        cur, first = next(plan, None), True
        if cur is not None:
            self.hint(_split(cur)[0])
        while cur is not None:
            idx, planned = _split(cur)
            nxt = next(plan, None)
            if nxt is not None and not first:
                self.hint(_split(nxt)[0])
            batch = fetch(cur)
            if batch is None:
                return
            if nxt is not None and first:
                self.hint(_split(nxt)[0])
            yield batch, (torch.from_numpy(idx) if planned is None else planned.draw)
            batch = None  # noqa: F841 - hold no reference while the user has the batch
            cur, first = nxt, False

    def _inline(self, plan: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
        """A pass of small batches, gathered in the caller's thread (see INLINE_BYTES)."""
        mine, first = self._passes, True
        DEMAND.add()  # from the first batch's first read on, no warm chunk goes before it
        try:
            for batch, records in self.announced(plan, lambda i: self.batch(i, self._gather_here)):
                if first:
                    first = False
                    DEMAND.release()
                if self._passes != mine:
                    raise LoaderError(CLOSED)
                yield batch, records
                batch = None  # noqa: F841 - as above
        finally:
            if first:
                DEMAND.release()

    def _small(self, idx: Any) -> bool:
        """Whether a pass whose first batch is ``idx`` is gathered in the caller's thread."""
        if self.collate is not None:
            return False
        return _split(idx)[0].size * int(np.prod(self.slot)) < INLINE_BYTES

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        self.close()
        plan = iter(self.plan)
        first = next(plan, None)
        if first is None:
            return
        plan = itertools.chain([first], plan)
        if self._small(first):
            yield from self._inline(plan)
            return
        run = Run(self, plan)
        self._active = run
        try:
            while True:
                item = run.next_item()
                if item is None:
                    return
                yield item
                item = None  # noqa: F841 - hold no reference while the user has the batch
        finally:
            run.close()
            if self._active is run:
                self._active = None


def _split(item: Any) -> tuple[np.ndarray, Planned | None]:
    """(int64 indices, the ``Planned`` batch or None) of one item of a plan."""
    if isinstance(item, Planned):
        return item.idx, item
    return np.asarray(item, dtype=np.int64), None
