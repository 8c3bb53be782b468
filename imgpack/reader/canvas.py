"""A batch's canvas: where each record lies in its slot, and the CPU's crop of a record.

A slot is ``slot_shape(codec, shape)``, each record at its top-left:

raw      (H, W, C): the record's (h, w, C) pixels at [0, h) x [0, w), zero beyond.
yuv420   (H + ceil(H/2), 2 ceil(W/2), 1): Y at [0, h) x [0, w); below row H, Cb at
         columns [0, ceil(w/2)) and Cr at [ceil(W/2), ceil(W/2) + ceil(w/2)), each
         ceil(h/2) rows; zero beyond each plane (``device.canvas_to_rgb`` reads it back).

``yuv_planes`` is the one statement of that layout: ``put`` writes it on the CPU, the
resident loader on the device, ``device.canvas_to_rgb`` reads it. A record's crop on a CPU is
``resample.crop_each``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from imgpack.format.codec import yuv420_planes

__all__ = ["slot_shape", "put", "yuv_planes"]


def slot_shape(codec: str, shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """(rows, columns, channels) of one record's slot in a batch of a pack of bound ``shape``
    (H, W, C): ``shape`` itself for raw and jpeg records, (H + ceil(H/2), 2 ceil(W/2), 1)
    for yuv420 (the yuv canvas: the module docstring)."""
    h, w, c = shape
    return (h + (h + 1) // 2, 2 * ((w + 1) // 2), 1) if codec == "yuv420" else (h, w, c)


def put(
    slot: np.ndarray, buf: np.ndarray, width: int, height: int, codec: str, bound_h: int
) -> None:
    """Write the stored record ``buf`` (its bytes) of ``width`` x ``height`` into the
    C-contiguous ``slot``, plane by plane: a raw record is one plane of rows of w * C bytes,
    a yuv420 record three (``yuv_planes``); zero beyond each."""
    if codec == "raw":
        pairs = [(slot.reshape(len(slot), -1, copy=False), buf.reshape(height, -1))]
    else:
        pairs = zip(yuv_planes(slot[..., 0], bound_h), yuv420_planes(buf, width, height))
    for into, plane in pairs:
        rows, cols = plane.shape
        into[:rows, :cols] = plane
        into[:rows, cols:] = 0
        into[rows:] = 0


def yuv_planes(plane: Any, height: int) -> tuple[Any, Any, Any]:
    """The (Y, Cb, Cr) regions of yuv canvas rows ``plane`` (..., H + ceil(H/2), 2 ceil(W/2))
    of a bound H high (the module docstring), numpy or torch: the one statement of the
    layout, which ``put`` writes and ``device.canvas_to_rgb`` reads."""
    half = plane.shape[-1] // 2
    return plane[..., :height, :], plane[..., height:, :half], plane[..., height:, half:]
