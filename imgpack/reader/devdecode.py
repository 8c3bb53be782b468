"""A JPEG pack's batches decoded on the loader's device (nvImageCodec, ``nvdecode``).

``make_loader(jpeg_ds, B, device="cuda", transform=...)`` decodes on the GPU when
``nvdecode.available(device)`` says it can (asked once, when the loader is built) and
``InProcessOptions(decode=...)`` allows it ("auto", the default; "cpu" never; "gpu" always,
or the reason it cannot as an error). Workers mode and per-sample work decode on the CPU.

The loader's thread then reads no pixel: each batch leaves it as an ``Encoded`` batch (the
records' stored bytes, zero-copy views of the mapping, and what to decode of each), and
``Delivery`` decodes it on its side stream into a uint8 (B, C, H, W) canvas on the device,
each record at the top-left of its slot, zero beyond, as the CPU path lays it out.

With ``DeviceTransform.train``/``.eval`` the crops are drawn first (``scaled.ScaledPlan``,
the same draws as the CPU path), and each record is decoded only in its region
(``regions``): the crop box widened by the reach of the resample's filter
(``resample.filter_weights``: half a box pixel per output pixel when shrinking, one pixel
when enlarging), rounded out to whole pixels and kept inside the record. The transform gets
the box shifted into that region and the region's extent, so what it computes is what it
would from the whole record: the same taps with the same weights (the extent stops them
only where the record itself ends). No DCT scaling: nvImageCodec has none for JPEG.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from imgpack.errors import InvalidArgumentError
from imgpack.reader import nvdecode
from imgpack.reader.augment import Draw
from imgpack.reader.protocol import EncodedSource

__all__ = ["DECODES", "encodes", "use_gpu", "regions", "Encoded"]

DECODES = ("auto", "cpu", "gpu")


def encodes(ds: Any) -> bool:
    """Whether ``ds`` hands out its records' bytes and names (``protocol.EncodedSource``)."""
    return isinstance(ds, EncodedSource)


def use_gpu(decode: str, device: Any, jpeg: bool) -> bool:
    """Whether a loader decodes a pack on ``device`` rather than on the CPU: ``decode`` is
    the option, ``jpeg`` whether the pack is a JPEG pack gathered whole in this process.
    "gpu" that cannot be kept raises (MissingExtraError names the pip command)."""
    if decode == "cpu" or (decode == "auto" and (not jpeg or device is None)):
        return False
    if not jpeg:
        raise InvalidArgumentError(
            "InProcessOptions(decode='gpu') decodes JPEG packs gathered whole; this loader "
            "has nothing to decode: drop decode='gpu'"
        )
    if device is None:
        raise InvalidArgumentError("InProcessOptions(decode='gpu') needs make_loader(device=...)")
    if nvdecode.available(device):
        return True
    if decode == "gpu":
        nvdecode.require(device)  # raises the reason
    return False


def _reach(lo: np.ndarray, hi: np.ndarray, size: int, end: np.ndarray) -> tuple[Any, Any]:
    """[first, last) pixels of one axis that the resample of [lo, hi) to ``size`` pixels
    can weigh, inside [0, end): a tap is within max(scale, 1) of a centre, the centres run
    from lo + scale/2 to hi - scale/2 (``resample.filter_weights``)."""
    scale = (hi - lo) / size
    width = np.maximum(scale, 1.0)
    first = np.clip(np.floor(lo + scale / 2 - width), 0, end - 1).astype(np.int64)
    last = np.clip(np.ceil(hi - scale / 2 + width), 0, end).astype(np.int64)
    return first, np.maximum(last, first + 1)


def regions(draw: Draw) -> tuple[np.ndarray, Draw]:
    """For a draw in record pixels (decoded at full scale): int64 (B, 4) regions (left,
    top, right, bottom) to decode, and the draw for a canvas of those regions (each at the
    top-left of its slot): crops shifted by each region's corner, sizes the regions'."""
    crop = np.asarray(draw.crop, dtype=np.float64)
    sizes = np.asarray(draw.sizes, dtype=np.int64)
    left, right = _reach(crop[:, 0], crop[:, 2], draw.size, sizes[:, 0])
    top, bottom = _reach(crop[:, 1], crop[:, 3], draw.size, sizes[:, 1])
    box = np.stack([left, top, right, bottom], axis=1)
    corner = np.stack([left, top, left, top], axis=1).astype(np.float64)
    extent = np.stack([right - left, bottom - top], axis=1)
    return box, draw._replace(crop=crop - corner, sizes=extent)


class Encoded(NamedTuple):
    """One batch before its decode on the device: each record's bytes, its region (None:
    the whole record), the canvas (H, W) and channels, and for errors each record's name
    and (w, h) from the index."""

    buffers: list[np.ndarray]
    regions: np.ndarray | None
    canvas: tuple[int, int]
    channels: int
    names: list[str]
    sizes: np.ndarray

    @classmethod
    def of(cls, ds: Any, idx: np.ndarray, box: np.ndarray | None, canvas: tuple) -> Encoded:
        """Records ``idx`` of ``ds`` (a ``PackedImageDataset``), in regions ``box``."""
        packs, local = ds.locate(idx)
        paths = [ix.data_path for ix in ds.indexes]
        names = [f"{paths[p]} record {k}" for p, k in zip(packs.tolist(), local.tolist())]
        sizes = np.asarray(ds.record_sizes)[idx]
        return cls(ds.encoded(idx), box, tuple(canvas), ds.channels, names, sizes)

    def decode(self, device: Any) -> torch.Tensor:
        """The uint8 (B, C, H, W) canvas on ``device`` (channels last in memory, as the CPU
        path's), decoded in one ``nvdecode.decode_batch`` call on the current stream."""
        boxes = None if self.regions is None else [tuple(r) for r in self.regions.tolist()]
        sizes = [tuple(s) for s in self.sizes.tolist()]
        tiles = nvdecode.decode_batch(
            self.buffers, self.channels, device, boxes, names=self.names, sizes=sizes
        )
        h, w = self.canvas
        out = torch.zeros((len(tiles), h, w, self.channels), dtype=torch.uint8, device=device)
        images = out.permute(0, 3, 1, 2)
        for i, tile in enumerate(tiles):  # (C, h, w), on the stream the decode ran on
            images[i, :, : tile.shape[1], : tile.shape[2]].copy_(tile)
        return images
