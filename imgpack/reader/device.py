"""The stages after the read: move each batch to its device, convert it there, transform it.

``make_loader(ds, 256, transform=T, device=D)`` yields ``(images, labels[, targets])``
already on ``D``. Each stage below does one thing to a ``Batch`` whose contents it knows
(the loader chose it for the pack and the call):

``Move``            every tensor of the batch to ``D`` (asynchronous from pinned memory).
``ToRgb``           a yuv canvas to RGB (``canvas_to_rgb``, below), zero beyond each record.
``Call``            a plain transform: ``T(images)``, or ``T(images, records)`` with the
                    batch's int64 record indices (a CPU tensor) when ``T`` takes them
                    (``takes_records``); a ``DeviceTransform`` that draws at random is
                    also passed the batch's own ``generator=``. (So a resident pack's RGB
                    canvas on a CPU is cropped by ``T(images, records)``: each record as
                    ``read.Crops`` crops it, from the draws the plan would have made.)
``ApplyDraw``       ``DeviceTransform.train``/``.eval``: ``T.apply(images, draw)`` with the
                    crops the plan drew.
``Normalise``       the same, where the read stage made the crops already (``read.Crops``, on
                    a CPU): ``T.finish(crops, draw)``.

``Deliver`` runs them. On CUDA they run on a side stream, one batch ahead of the loop, so
they overlap the training step; before a batch is handed over, the consumer's current
stream waits on an event recorded after that work, and each tensor is ``record_stream``-ed
on the consumer's stream, so the caching allocator does not reuse its memory while the step
still reads it. On any other device (``"cpu"`` in the tests) they run in order, in the
loop's thread.

**The yuv canvas** (``canvas_to_rgb``): a yuv420 batch back to RGB, in torch, on whatever
device the batch is on.

A yuv420 pack's batch crosses the bus as its **yuv canvas**: one uint8 (B, 1, Hc, Wc)
tensor, Hc = H + ceil(H/2) and Wc = 2 * ceil(W/2) for the pack's bound H x W. For each
sample b (record of w x h, ``cw = ceil(w/2)``, ``ch = ceil(h/2)``, ``CW = ceil(W/2)``)::

    rows [0, H)        Y   at [0, h) x [0, w)                     zero elsewhere
    rows [H, Hc)       Cb  at [H, H + ch) x [0, cw)               zero elsewhere
                       Cr  at [H, H + ch) x [CW, CW + cw)         in columns [0, CW) / [CW, Wc)

so a batch is as many bytes as its records' planes padded to the bound (1.5 bytes per
pixel, half of raw RGB). ``yuv420_to_rgb`` undoes it as ``docs/format.md`` defines:
each chroma sample replicated over its 2x2 block, then per pixel
R = Y + 1.402 (Cr-128), G = Y - 0.344136 (Cb-128) - 0.714136 (Cr-128),
B = Y + 1.772 (Cb-128), each rounded half up and clipped to 0..255. Each channel is Y
plus a whole number that depends only on the pixel's chroma sample, which the format
tabulates for every (Cb, Cr) (``imgpack.format.codec.YUV420_OFFSETS``); this module looks
those offsets up (a copy of that table on the batch's device), so the numpy and torch
conversions are one definition and agree byte for byte on every device, ties included
(1.772 * 125 is exactly 221.5, which float32 or float64 may round either way). The
per-pixel work is one small-integer add per channel, a clamp and a cast, written plane by
plane (contiguous (B, 3, H, W), not channels_last: that is where it is fast). On a CPU a
reader converts each record with the format's ``yuv420_to_rgb`` instead, in the threads
that read it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import torch

from imgpack.errors import InvalidArgumentError
from imgpack.format.codec import YUV420_OFFSETS
from imgpack.reader.canvas import slot_shape, yuv_planes
from imgpack.reader.read import Batch, tree_map

__all__ = ["canvas_to_rgb", "Move", "ToRgb", "Call", "ApplyDraw", "Normalise", "described"]


def takes_records(fn: Callable[..., Any]) -> bool:  # Call's rule (not exported)
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
    """A yuv canvas of records within the batch's H x W bound (``Batch.hw``) to RGB
    (B, 3, H, W), zero beyond each."""

    def __call__(self, batch: Batch) -> Batch:
        return batch.filled(canvas_to_rgb(batch.images, batch.hw, sizes=batch.sizes))


class Call:
    """A plain batched transform: ``T(images)`` or ``T(images, records)``; the base of the
    stages that call a ``DeviceTransform``. A batch with a ``seed`` (a ``DeviceTransform``
    drawing windows or flips at random) passes its own generator: ``T(images,
    generator=...)``."""

    def __init__(self, transform: Callable[..., Any]) -> None:
        self.transform, self.with_records = transform, takes_records(transform)

    def __call__(self, batch: Batch) -> Batch:
        args = (torch.from_numpy(batch.records),) if self.with_records else ()
        kw = {} if batch.seed is None else {"generator": batch.generator()}
        return batch.filled(self.transform(batch.images, *args, **kw))


class ApplyDraw(Call):
    """``DeviceTransform.train``/``.eval`` applied with the crops the plan drew."""

    def __call__(self, batch: Batch) -> Batch:
        return batch.filled(self.transform.apply(batch.images, batch.draw))


class Normalise(Call):
    """``DeviceTransform.train``/``.eval`` finished on crops the read stage made."""

    def __call__(self, batch: Batch) -> Batch:
        return batch.filled(self.transform.finish(batch.images, batch.draw))


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
        stream, staged = torch.cuda.Stream(self.device), []
        for batch in batches:  # batch k+1 is queued before batch k is handed over
            # a batch already on the device (a resident one) was made on the loop's stream:
            # the side stream waits for it, and its memory is kept until the side is done
            stream.wait_stream(torch.cuda.current_stream(self.device))
            _record(stream, (batch.images, batch.rest))
            with torch.cuda.stream(stream):
                staged.append((self._apply(batch), stream.record_event()))
            batch = None
            if len(staged) == 2:
                yield self._hand(*staged.pop(0))
        yield from (self._hand(*last) for last in staged)

    def _hand(self, out: Any, done: Any) -> Any:
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(done)
        return _record(consumer, out)


def _record(stream: Any, obj: Any) -> Any:
    """Every CUDA tensor in ``obj`` marked as used on ``stream``; ``obj`` back."""
    tree_map(lambda t: t.record_stream(stream) if t.is_cuda else None, obj)
    return obj


def canvas_to_rgb(
    canvas: torch.Tensor, bound: tuple[int, int], *, sizes: Any = None
) -> torch.Tensor:
    """uint8 yuv canvas (B, 1, Hc, Wc) of an H x W bound -> uint8 RGB (B, 3, H, W), contiguous.

    ``sizes`` (B, 2) (width, height) of each record, when records may be smaller than the
    bound: RGB beyond each record is then zero (without it, the padding of a yuv canvas
    converts to (0, 135, 0), the colour of Y = Cb = Cr = 0, and a record of odd size shows
    a column or row of its replicated chroma beyond its edge).
    """
    height, width = bound
    hc, wc, _ = slot_shape("yuv420", (height, width, 3))
    uint8 = isinstance(canvas, torch.Tensor) and canvas.dtype == torch.uint8
    if not uint8 or tuple(canvas.shape[1:]) != (1, hc, wc):
        raise InvalidArgumentError(
            f"a yuv420 canvas of {width}x{height} records is uint8 (B, 1, {hc}, {wc}), "
            f"found {described(canvas)}"
        )
    b, ch, cw, dev = canvas.shape[0], hc - height, wc // 2, canvas.device
    plane = canvas[:, 0]
    _, cb, cr = (p.to(torch.int32) for p in yuv_planes(plane, height))
    # Y over whole 2x2 blocks: rows [0, 2 ch) of the canvas (for an odd H the last of
    # them is the first chroma row, cut off at the end), all 2 cw columns
    y = plane[:, : 2 * ch].to(torch.int16)
    if sizes is not None:  # beyond a record, Y = -256: 0 whatever its chroma adds
        ext = torch.as_tensor(sizes).to(device=dev, dtype=torch.int64)
        if tuple(ext.shape) != (b, 2):
            raise InvalidArgumentError(f"sizes should be (B, 2) = ({b}, 2), found {described(ext)}")
        rows = torch.arange(2 * ch, device=dev)[None, :, None] < ext[:, 1, None, None]
        cols = torch.arange(2 * cw, device=dev)[None, None, :] < ext[:, 0, None, None]
        y.masked_fill_(~(rows & cols), -256)
    y = y.view(b, ch, 2, 2 * cw)
    out = torch.empty((b, 3, 2 * ch, 2 * cw), dtype=torch.uint8, device=dev)
    # each chroma sample's row of the table (Cb * 256 + Cr): its three offsets
    sample = (cb * 256 + cr).to(torch.int64)
    for k in range(3):  # looked up, then over each sample's 2 columns
        add = _table(dev)[k][sample].repeat_interleave(2, -1)[:, :, None]
        out[:, k].view(b, ch, 2, 2 * cw).copy_(y.add(add).clamp_(0, 255))
    out = out[:, :, :height, :width]
    return out if (height, width) == (2 * ch, 2 * cw) else out.contiguous()


@functools.cache
def _table(device: torch.device) -> torch.Tensor:
    """The format's offsets as an int16 (3, 65536) tensor on ``device``, made once."""
    return torch.from_numpy(YUV420_OFFSETS.reshape(3, -1).copy()).to(device)


def described(x: Any) -> str:
    """How an error names what it was given: a tensor's dtype and shape, else its type,
    named with its package where it is not a builtin (numpy's ``Generator`` is not torch's)."""
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} {tuple(x.shape)}"
    kind = type(x)
    public = kind.__module__.split("._")[0]  # numpy.random._generator -> numpy.random
    return kind.__qualname__ if public == "builtins" else f"{public}.{kind.__qualname__}"
