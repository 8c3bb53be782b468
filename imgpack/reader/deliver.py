"""The last step of a loader: move each batch to its device and run the batched transform.

``make_loader(ds, 256, transform=T, device=D)`` yields ``(images, labels[, targets])``
already on ``D``, with ``images = T(images_on_D, records)``, where ``records`` is the
batch's int64 record indices (a CPU tensor), so ``T`` can look up each sample's geometry.
A batch of a JPEG pack decoded at its crops' scales (``imgpack.reader.scaled``) comes with
its draw in place of the indices: ``T.apply(images, draw)`` then (``DeviceTransform``).
A JPEG pack decoded on the GPU (``imgpack.reader.devdecode``) arrives as its stored
bytes (``Encoded``) and is decoded first, on the device, into the canvas the CPU path
would have made (for a draw, of each record's region only, the draw shifted to match).
One decoded on the CPU for a CUDA device arrives packed (``imgpack.reader.packed``) and is
laid out as that canvas on the device.
A plain one-argument callable (torchvision style) is called as ``T(images)``: the
signature is inspected once; ``records`` is passed when ``T`` has a second required
positional parameter, or one named ``records`` (``lambda x, m=mean: ...`` is one-argument).

A yuv420 pack's batches cross the bus as their yuv canvas (``imgpack.reader.yuv``), half
the bytes of RGB, and become RGB right after the copy, before ``T``: on ``D``, or on the
CPU where there is no device. ``Canvas`` says what a gathered batch's images are; a
batch of samples collated one by one is RGB already and passes as it is.

On CUDA the host-to-device copy, the conversion and ``T`` run on a side stream, one batch
ahead of the loop, so they overlap the training step. Before a batch is handed over, the
consumer's current stream waits on an event recorded after that work, and each tensor is
``record_stream``-ed on the consumer's stream, so the caching allocator does not reuse
its memory while the step still reads it. On any other device (``"cpu"`` in the tests)
the same steps run synchronously, in order.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from imgpack.errors import InvalidArgumentError
from imgpack.reader.augment import Draw
from imgpack.reader.devdecode import Encoded
from imgpack.reader.packed import Packed
from imgpack.reader.protocol import PackedSource
from imgpack.reader.yuv import yuv420_to_rgb

__all__ = ["Canvas", "Delivery", "takes_records"]


class Canvas(NamedTuple):
    """What a gathered batch's images are: records of ``codec`` in an H x W canvas.

    ``sizes``: int64 (N, 2) (width, height) of every record, or None when every record
    fills the canvas (then nothing lies beyond any record).
    """

    codec: str
    height: int
    width: int
    sizes: torch.Tensor | None

    @classmethod
    def of(cls, ds: PackedSource) -> Canvas:
        h, w, _ = ds.shape
        sizes = np.asarray(ds.record_sizes)
        fills = bool((sizes == np.array([w, h])).all())
        return cls(ds.codec, h, w, None if fills else torch.from_numpy(sizes.astype(np.int64)))

    @property
    def varying(self) -> bool:
        """Whether some record is smaller than the canvas."""
        return self.sizes is not None


def takes_records(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` should be called as ``fn(images, records)`` rather than ``fn(images)``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: the plain call
        return False
    params = list(sig.parameters.values())
    if any(p.name == "records" for p in params):
        return True
    required = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(required) >= 2


def _move(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_move(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _move(v, device) for k, v in obj.items()}
    return obj


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


class Delivery:
    """Turns (batch, records) pairs from a source into the batches the loop receives."""

    def __init__(
        self,
        device: Any = None,
        transform: Callable[..., Any] | None = None,
        canvas: Canvas | None = None,
    ) -> None:
        try:
            self.device = None if device is None else torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise InvalidArgumentError(f"device {device!r} is not a torch device: {e}") from None
        if self.device is not None and self.device.type == "cuda" and not torch.cuda.is_available():
            raise InvalidArgumentError(
                f"device {device!r}: this torch has no CUDA device (torch.cuda.is_available() "
                "is False); pass device='cpu' or none"
            )
        if transform is not None and not callable(transform):
            raise InvalidArgumentError(
                f"transform should be callable, found {type(transform).__name__}"
            )
        self.transform = transform
        self.with_records = transform is not None and takes_records(transform)
        self.cuda = self.device is not None and self.device.type == "cuda"
        # gathered yuv420 batches: converted to RGB after the copy (None: images are RGB)
        self.yuv = canvas if canvas is not None and canvas.codec == "yuv420" else None

    @property
    def idle(self) -> bool:
        """True when batches pass through untouched."""
        return self.device is None and self.transform is None and self.yuv is None

    def _rgb(self, batch: Any, records: torch.Tensor) -> Any:
        """(images, ...) with the yuv canvas replaced by RGB, zero beyond each record."""
        c = self.yuv
        sizes = None if c.sizes is None else c.sizes[torch.as_tensor(records)]
        return (yuv420_to_rgb(batch[0], c.height, c.width, sizes=sizes), *batch[1:])

    def _apply(self, batch: Any, records: torch.Tensor) -> Any:
        if isinstance(batch, tuple) and batch and isinstance(batch[0], Encoded):
            batch = (batch[0].decode(self.device), *batch[1:])  # on the current stream
        elif isinstance(batch, tuple) and batch and isinstance(batch[0], Packed):
            batch = (batch[0].to_canvas(self.device), *batch[1:])  # likewise
        if self.device is not None:
            batch = _move(batch, self.device)
        if self.yuv is not None:
            batch = self._rgb(batch, records)
        if self.transform is None:
            return batch
        if not isinstance(batch, (tuple, list)) or not batch:
            raise InvalidArgumentError(
                f"transform= needs batches of (images, labels, ...), found {type(batch).__name__}"
            )
        if isinstance(records, Draw):  # drawn before the decode (imgpack.reader.scaled)
            images = self.transform.apply(batch[0], records)
        elif self.with_records:
            images = self.transform(batch[0], torch.as_tensor(records))
        else:
            images = self.transform(batch[0])
        return (images, *batch[1:])

    def __call__(self, items: Iterator[tuple[Any, torch.Tensor]]) -> Iterator[Any]:
        if self.idle:
            for batch, _ in items:
                yield batch
        elif not self.cuda:
            for batch, records in items:
                yield self._apply(batch, records)
        else:
            yield from self._cuda(items)

    def _cuda(self, items: Iterator[tuple[Any, torch.Tensor]]) -> Iterator[Any]:
        stream = torch.cuda.Stream(self.device)

        def stage(batch: Any, records: torch.Tensor) -> tuple[Any, Any]:
            with torch.cuda.stream(stream):
                out = self._apply(batch, records)
                done = torch.cuda.Event()
                done.record(stream)
            return out, done

        def hand(out: Any, done: Any) -> Any:
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_event(done)
            for t in _tensors(out):
                if t.device.type == "cuda":
                    t.record_stream(consumer)
            return out

        pending = None
        for batch, records in items:
            staged = stage(batch, records)  # batch k+1 is queued before batch k is handed over
            batch = records = None
            if pending is not None:
                yield hand(*pending)
            pending = staged
        if pending is not None:
            yield hand(*pending)
