"""The CPU crop of a box enlarged on both axes, by OpenCV (the ``cpu`` extra, via ``imgpack.jit``).

Where a box is no larger than the output on either axis, Pillow's BILINEAR filter has a
support of one pixel: each output is the two record pixels either side of its centre,
weighted by distance, with the edge pixel standing in past the edge. That is bilinear
interpolation at the box's fractional centres, which OpenCV's ``warpAffine`` computes
(``INTER_LINEAR``, ``BORDER_REPLICATE``) in vectorised fixed point at any position: no
whole-pixel start to align, no extra outputs, about twice as fast as torch's separable
kernel on a crop (docs/benchmarks.md), within a level of Pillow's exact resample. OpenCV 4
quantised its sample positions to 1/32 of a pixel (up to 7 levels off on a sharp edge); this
module needs OpenCV 5, and refuses to load on an older one, so those crops go to torch. These
are most RandomResizedCrop boxes on a pack packed near the output size and every centre crop
of it; ``cpuresample.resample_record`` sends the others (and every box where OpenCV 5 is not
installed or ``IMGPACK_OPENCV=0``) to torch's kernel.

A flip mirrors the record's region (smaller than the crop) and resamples it forwards: a
mirrored grid, which reads the region backwards, measured slower. OpenCV 5 spreads a crop of
more than about 20,000 pixels over its own thread pool, beside the loader's threads; the
figures in docs/benchmarks.md were measured so (bands small enough to stay in the calling
thread measured no faster).
"""

from __future__ import annotations

import math

import cv2
import numpy as np

__all__ = ["warp_record"]

if int(cv2.__version__.split(".")[0]) < 5:
    raise ImportError(f"OpenCV {cv2.__version__} places warpAffine's samples to 1/32 pixel: "
                      "imgpack's crops need OpenCV 5")  # fmt: skip

_FLAGS = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
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
        region = region.copy()  # compact, and positive strides (a view of one row may keep
        # a negative one that numpy calls contiguous)
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
    grid = np.array([[sx, 0.0, a], [0.0, sy, b]])
    made = cv2.warpAffine(image, grid, (size, size), dst=into, flags=_FLAGS,
                          borderMode=cv2.BORDER_REPLICATE)  # fmt: skip
    if not np.may_share_memory(made, into):  # OpenCV made a new array: copy it over
        np.copyto(into, made)
    if dst is not out:
        np.copyto(out, dst)
    return out
