"""The per-record crop resamplers the CPU kernels' benchmark compares, one call each.

Each is ``fn(record, box, size, flip, out)``: ``record`` uint8 (h, w, 3), ``box`` the crop in
record pixels (fractional), ``out`` the (size, size, 3) slot to write.

* ``pillow``: imgpack's kernel (``imgpack.reader.cpuresample.resample_record``): Pillow's
  BILINEAR resample of the exact box.
* ``torch_rounded``: torch's uint8 antialiased bilinear ``interpolate`` (channels_last) of
  the box rounded to whole pixels, as an integer crop must be.
* ``torch_aligned``: the same torch kernel made to sample the exact box: torch places output
  j of an input starting at x0 at x0 + (j + 1/2) s, so with the box's own scale s, outputs
  k .. k + size - 1 of an input starting at x0 = left - k s fall on the box's centres; k is
  the one (of 32) that brings x0 closest to a whole pixel (edge pixels replicated where x0
  falls left of the record), the extra k outputs are thrown away, and a box that no k
  aligns to within ``ALIGN`` pixels goes to Pillow (so does an input as long as its output,
  which torch copies whatever the scale).
* ``opencv``: FFCV's CPU resize, ``cv2.resize(..., INTER_AREA)`` of the rounded box
  (``workbench.bench_jpeg_speed.ffcv_resize``; Pillow's BOX where OpenCV is missing).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from imgpack.reader.cpuresample import resample_record
from workbench.bench_jpeg_speed import ffcv_resize

__all__ = [
    "ALIGN",
    "CANDIDATES",
    "RESIZE_NAME",
    "rounded",
    "pillow",
    "torch_rounded",
    "torch_aligned",
    "opencv",
]

ALIGN = 0.05  # record pixels: torch_aligned's largest misplacement of the box's grid
_TRIES = 32


def rounded(box: np.ndarray) -> tuple[int, int, int, int]:
    """The box to whole pixels, at least one pixel wide and high (FFCV's integer crop)."""
    x0, y0, x1, y1 = (int(v) for v in np.rint(box))
    return x0, y0, max(x1, x0 + 1), max(y1, y0 + 1)


def pillow(record: np.ndarray, box, size: int, flip: bool, out: np.ndarray) -> None:
    resample_record(record, box, size, flip, out)


def _put(pixels: torch.Tensor, flip: bool, out: np.ndarray) -> None:
    hwc = pixels[0].permute(1, 2, 0).numpy()
    np.copyto(out, hwc[:, ::-1] if flip else hwc)


def torch_rounded(record: np.ndarray, box, size: int, flip: bool, out: np.ndarray) -> None:
    x0, y0, x1, y1 = rounded(box)
    crop = torch.from_numpy(np.ascontiguousarray(record[y0:y1, x0:x1])).permute(2, 0, 1)[None]
    _put(torch.nn.functional.interpolate(crop, size=(size, size), mode="bilinear",
                                         antialias=True), flip, out)  # fmt: skip


def _align(lo: float, hi: float, size: int, extent: int) -> tuple[int, int, int, float]:
    """(x0, x1, k, miss): input [x0, x1), outputs from k, the grid's misplacement. An input
    as long as the output is never chosen: torch then copies it, whatever the scale."""
    s = (hi - lo) / size
    support = max(s, 1.0)
    first = max(int(lo + 0.5 * s - support + 0.5), 0)  # Pillow's first tap of output 0
    x1 = min(extent, int(hi - 0.5 * s + support + 0.5) + 1)
    best = (0, 0, float("inf"))
    for k in range(_TRIES):
        start = lo - k * s
        x0 = math.floor(start + 0.5)
        if x0 <= first and x1 - x0 != k + size and abs(start - x0) < abs(best[2]):
            best = (x0, k, start - x0)
    x0, k, miss = best
    return x0, x1, k, miss


def _replicated(record: np.ndarray, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
    py, px = max(-y0, 0), max(-x0, 0)
    buf = np.empty((y1 - y0, x1 - x0, record.shape[2]), dtype=np.uint8)
    buf[py:, px:] = record[max(y0, 0) : y1, max(x0, 0) : x1]
    buf[:py] = buf[py]
    buf[:, :px] = buf[:, px : px + 1]
    return buf


def torch_aligned(record: np.ndarray, box, size: int, flip: bool, out: np.ndarray) -> None:
    h, w, _ = record.shape
    x0, x1, kx, mx = _align(box[0], box[2], size, w)
    y0, y1, ky, my = _align(box[1], box[3], size, h)
    if max(abs(mx), abs(my)) > ALIGN:
        resample_record(record, box, size, flip, out)
        return
    crop = torch.from_numpy(_replicated(record, y0, y1, x0, x1)).permute(2, 0, 1)[None]
    sx, sy = (box[2] - box[0]) / size, (box[3] - box[1]) / size
    big = torch.ops.aten._upsample_bilinear2d_aa(
        crop, [ky + size, kx + size], False, 1 / sy, 1 / sx
    )
    _put(big[:, :, ky:, kx:], flip, out)


_RESIZE, RESIZE_NAME = ffcv_resize()


def opencv(record: np.ndarray, box, size: int, flip: bool, out: np.ndarray) -> None:
    x0, y0, x1, y1 = rounded(box)
    if flip:  # FFCV flips as a stage of its own, from the resized image
        resized = np.empty_like(out)
        _RESIZE(record[y0:y1, x0:x1], size, resized)
        np.copyto(out, resized[:, ::-1])
    else:
        _RESIZE(record[y0:y1, x0:x1], size, out)


CANDIDATES: dict[str, Callable[..., None]] = {
    "imgpack: Pillow, exact box": pillow,
    "torch antialias, box rounded": torch_rounded,
    "torch antialias, box aligned": torch_aligned,
    f"FFCV: {RESIZE_NAME}, box rounded": opencv,
}
