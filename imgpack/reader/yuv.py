"""A yuv420 batch back to RGB, in torch, on whatever device the batch is on.

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

from typing import Any

import torch

from imgpack.errors import InvalidArgumentError
from imgpack.format.codec import YUV420_OFFSETS
from imgpack.reader.canvas import slot_shape, yuv_planes

__all__ = ["canvas_to_rgb"]

_TABLES: dict[torch.device, torch.Tensor] = {}  # YUV420_OFFSETS as (3, 65536), per device


def _found(x: Any) -> str:
    return f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


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
    if (
        not isinstance(canvas, torch.Tensor)
        or canvas.dtype != torch.uint8
        or tuple(canvas.shape[1:]) != (1, hc, wc)
    ):
        raise InvalidArgumentError(
            f"a yuv420 canvas of {width}x{height} records is uint8 (B, 1, {hc}, {wc}), "
            f"found {_found(canvas)}"
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
            raise InvalidArgumentError(f"sizes should be (B, 2) = ({b}, 2), found {_found(ext)}")
        rows = torch.arange(2 * ch, device=dev)[None, :, None] < ext[:, 1, None, None]
        cols = torch.arange(2 * cw, device=dev)[None, None, :] < ext[:, 0, None, None]
        y.masked_fill_(~(rows & cols), -256)
    y = y.view(b, ch, 2, 2 * cw)
    out = torch.empty((b, 3, 2 * ch, 2 * cw), dtype=torch.uint8, device=dev)
    # each chroma sample's row of the table (Cb * 256 + Cr): its three offsets
    sample = (cb * 256 + cr).to(torch.int64)
    table = _table(dev)
    for k in range(3):  # looked up, then over each sample's 2 columns
        add = table[k][sample].repeat_interleave(2, -1)[:, :, None]
        out[:, k].view(b, ch, 2, 2 * cw).copy_(y.add(add).clamp_(0, 255))
    out = out[:, :, :height, :width]
    return out if (height, width) == (2 * ch, 2 * cw) else out.contiguous()


def _table(device: torch.device) -> torch.Tensor:
    """The format's offsets as an int16 (3, 65536) tensor on ``device``, made once."""
    if device not in _TABLES:
        _TABLES[device] = torch.from_numpy(YUV420_OFFSETS.reshape(3, -1).copy()).to(device)
    return _TABLES[device]
