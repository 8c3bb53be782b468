"""The CPU crop of a box enlarged on both axes, by OpenCV (the ``cpu`` extra, via ``imgpack.jit``).

Where a box is no larger than the output on either axis, Pillow's BILINEAR filter has a
support of one pixel: each output is the two record pixels either side of its centre,
weighted by distance, with the edge pixel standing in past the edge. That is bilinear
interpolation at the box's fractional centres, which OpenCV's ``warpAffine`` computes
(``INTER_LINEAR``, ``BORDER_REPLICATE``) in vectorised fixed point at any position: no
whole-pixel start to align, no extra outputs, about twice as fast as torch's separable
kernel on a crop (docs/benchmarks.md). Its positions are quantised to 1/32 of a pixel, inside
``cpuresample.ALIGN``. These are most RandomResizedCrop boxes on a pack packed near the
output size and every centre crop of it; ``cpuresample.resample_record`` sends the others
(and every box where OpenCV is not installed or ``IMGPACK_OPENCV=0``) to torch's kernel.

A flip mirrors the record's region (smaller than the crop) and resamples it forwards: a
mirrored grid, which reads the region backwards, measured slower. The output is made in bands
of at most 2^16 pixels, which OpenCV computes in the calling thread: the loader already
spreads the records over its threads, and OpenCV's own pool would only contend with them
(and would be one more pool to survive a DataLoader worker's fork).
"""

from __future__ import annotations

import math

import cv2
import numpy as np

__all__ = ["warp_record"]

_FLAGS = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
_BAND = 2**16  # output pixels OpenCV makes in one stripe, in the calling thread
LIMIT = 2**15 - 8
"""Pixels: OpenCV's remap holds coordinates in 16 bits; longer outputs go to torch."""


def _cv_layout(a: np.ndarray) -> bool:
    """Whether OpenCV reads or writes ``a`` (h, w, C) in place: pixels and channels packed,
    rows apart at any step that holds one."""
    h, w, c = a.shape
    return a.strides[2] == 1 and a.strides[1] == c and a.strides[0] >= w * c


def warp_record(
    src: np.ndarray, box: tuple[float, float, float, float], size: int, flip: bool,
    out: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """``cpuresample.resample_record`` for a box (clipped to ``src``) at most ``size`` pixels
    on each side, ``size`` under ``LIMIT``: the arguments are checked there."""
    left, top, right, bottom = box
    h, w, c = src.shape
    x0, x1 = max(math.floor(left) - 1, 0), min(math.ceil(right) + 1, w)
    y0, y1 = max(math.floor(top) - 1, 0), min(math.ceil(bottom) + 1, h)
    region = src[y0:y1, x0:x1]
    if not _cv_layout(region):
        region = np.ascontiguousarray(region)
    dst = out if _cv_layout(out) else np.empty((size, size, c), np.uint8)
    # OpenCV reads an (h, w, 1) array as one channel, but makes (h, w) ones
    image, into = (region[..., 0], dst[..., 0]) if c == 1 else (region, dst)
    sx, sy = (right - left) / size, (bottom - top) / size
    # output (j, i) reads the region at index (a + j sx, b + i sy): the box's centre
    # left + (j + 1/2) sx, less half a pixel (pixel x's centre is x + 1/2)
    a, b = left + 0.5 * sx - 0.5 - x0, top + 0.5 * sy - 0.5 - y0
    if flip:
        image = cv2.flip(image, 1)
        a = (x1 - x0 - 1) - (right - 0.5 * sx - 0.5 - x0)  # the same centres, read mirrored
    rows = max(_BAND // size, 1)
    for first in range(0, size, rows):
        band = into[first : first + rows]
        grid = np.array([[sx, 0.0, a], [0.0, sy, b + first * sy]])
        made = cv2.warpAffine(image, grid, (size, len(band)), dst=band, flags=_FLAGS,
                              borderMode=cv2.BORDER_REPLICATE)  # fmt: skip
        if not np.may_share_memory(made, band):  # OpenCV made a new array: copy it over
            np.copyto(band, made)
    if dst is not out:
        np.copyto(out, dst)
    return out
