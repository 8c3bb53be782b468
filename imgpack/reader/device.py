"""The stages after the read: move each batch to its device, convert it there, transform it.

``make_loader(ds, 256, transform=T, device=D)`` yields ``(images, labels[, targets])``
already on ``D``. Each stage below does one thing to a ``Batch`` whose contents it knows
(the loader chose it for the pack and the call):

``Move``            every tensor of the batch to ``D`` (asynchronous from pinned memory).
``ToRgb``           a yuv canvas to RGB (``yuv.canvas_to_rgb``), zero beyond each record.
``Call``            a plain transform: ``T(images)``, or ``T(images, records)`` with the
                    batch's int64 record indices (a CPU tensor) when ``T`` takes them
                    (``takes_records``).
``ApplyDraw``       ``DeviceTransform.train``/``.eval``: ``T.apply(images, draw)`` with the
                    crops the plan drew.
``Normalise``       the same, where the read stage made the crops already (``read.Crops``, on
                    a CPU): ``T.finish(crops, draw)``.
``CropEach``        the same on an RGB canvas on a CPU (a resident pack): each record's crop
                    made as ``read.Crops`` makes it, then normalised.

``Deliver`` runs them. On CUDA they run on a side stream, one batch ahead of the loop, so
they overlap the training step; before a batch is handed over, the consumer's current
stream waits on an event recorded after that work, and each tensor is ``record_stream``-ed
on the consumer's stream, so the caching allocator does not reuse its memory while the step
still reads it. On any other device (``"cpu"`` in the tests) they run in order, in the
loop's thread.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import torch

from imgpack.reader.plan import Batch, tree_map
from imgpack.reader.read import BufferPool
from imgpack.reader.yuv import canvas_to_rgb

__all__ = [
    "takes_records",
    "Move",
    "ToRgb",
    "Call",
    "ApplyDraw",
    "Normalise",
    "CropEach",
]

_KEPT = 3  # float batches kept for reuse: the loop holds one while the next is made
_POOLED = (torch.float32, torch.float64)  # the dtypes normalise writes its output in


def takes_records(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` should be called as ``fn(images, records)`` rather than ``fn(images)``:
    it has a second required positional parameter, or one named ``records``
    (``lambda x, m=mean: ...`` takes one)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: the plain call
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in positional and p.default is p.empty]
    return any(p.name == "records" for p in params) or len(required) >= 2


class Move:
    """Every tensor of the batch to ``device`` (containers and anything else as they are).

    Asynchronous only from pinned memory; from pageable memory the copy is simply
    synchronous. Memory format is kept (channels_last stays). A pinned source may be
    dropped at once: torch's caching host allocator reuses it only after the copy out of
    it is done."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self, batch: Batch) -> Batch:
        pair = (batch.images, batch.rest)
        return batch.filled(*tree_map(lambda t: t.to(self.device, non_blocking=True), pair))


class ToRgb:
    """A yuv canvas of records within an H x W ``bound`` to RGB (B, 3, H, W), zero beyond
    each."""

    def __init__(self, bound: tuple[int, int]) -> None:
        self.bound = bound

    def __call__(self, batch: Batch) -> Batch:
        return batch.filled(canvas_to_rgb(batch.images, self.bound, sizes=batch.sizes))


class Call:
    """A plain batched transform: ``T(images)`` or ``T(images, records)``; the base of the
    stages that call a ``DeviceTransform``."""

    def __init__(self, transform: Callable[..., Any]) -> None:
        self.transform, self.with_records = transform, takes_records(transform)

    def __call__(self, batch: Batch) -> Batch:
        args = (torch.from_numpy(batch.records),) if self.with_records else ()
        return batch.filled(self.transform(batch.images, *args))


class ApplyDraw(Call):
    """``DeviceTransform.train``/``.eval`` applied with the crops the plan drew."""

    def __call__(self, batch: Batch) -> Batch:
        return batch.filled(self.transform.apply(batch.images, batch.draw))


class Normalise(Call):
    """``DeviceTransform.train``/``.eval`` finished on crops the read stage made, into float
    batches reused once the loop drops them: a fresh 150 MB batch pays a page fault per
    4 KB, which on a CPU costs more than the normalise itself."""

    pool: BufferPool | None = None  # for the transform's dtype, made on first use

    def __call__(self, batch: Batch) -> Batch:
        return batch.filled(self.transform.finish(batch.images, batch.draw, self._out(batch)))

    def _out(self, batch: Batch) -> torch.Tensor | None:
        """A pooled (B, S, S, C) float batch to normalise into, or None (a fresh one)."""
        dtype = self.transform.dtype  # read per batch: the user may change it
        if dtype not in _POOLED:
            return None
        if self.pool is None or self.pool.dtype != dtype:
            self.pool = BufferPool(_KEPT, dtype=dtype)
        size, c = batch.draw.size, batch.images.shape[1]
        return self.pool.take(len(batch.records), (size, size, c))[0]


class CropEach(Normalise):
    """``DeviceTransform.train``/``.eval`` on an RGB canvas on a CPU (a resident pack's):
    each record's crop made by the pool's threads as the streamed loader's ``read.Crops``
    makes it (the same bytes), then normalised as ``Normalise`` does."""

    def __call__(self, batch: Batch) -> Batch:
        return batch.filled(self.transform._crop(batch.images, batch.draw, self._out(batch)))


class Deliver:
    """Runs the device stages over a source's batches and hands out each ``output()``."""

    def __init__(self, stages: Sequence[Callable[[Batch], Batch]], device: Any) -> None:
        self.stages, self.device = tuple(stages), device

    def _apply(self, batch: Batch) -> Any:
        for stage in self.stages:
            batch = stage(batch)
        return batch.output()

    def __call__(self, batches: Iterator[Batch]) -> Iterator[Any]:
        if self.device is None or self.device.type != "cuda":
            yield from map(self._apply, batches)
            return
        stream, pending = torch.cuda.Stream(self.device), None
        for batch in batches:  # batch k+1 is queued before batch k is handed over
            # a batch already on the device (a resident one) was made on the loop's stream:
            # the side stream waits for it, and its memory is kept until the side is done
            stream.wait_stream(torch.cuda.current_stream(self.device))
            _record(stream, (batch.images, batch.rest))
            with torch.cuda.stream(stream):
                staged = self._apply(batch), torch.cuda.Event()
                staged[1].record(stream)
            batch = None
            if pending is not None:
                yield self._hand(*pending)
            pending = staged
        if pending is not None:
            yield self._hand(*pending)

    def _hand(self, out: Any, done: Any) -> Any:
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(done)
        return _record(consumer, out)


def _record(stream: Any, obj: Any) -> Any:
    """Every CUDA tensor in ``obj`` marked as used on ``stream``; ``obj`` back."""
    tree_map(lambda t: t.record_stream(stream) if t.is_cuda else None, obj)
    return obj
