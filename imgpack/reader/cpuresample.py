"""One record's crop, resized on the CPU into its slot of a batch: the box's BILINEAR resample.

``DeviceTransform.train``/``.eval`` resample each sample's box as Pillow's
``Image.resize((S, S), BILINEAR, box=box)`` does (``imgpack.reader.resample``: two batched
matmuls, in float, over a whole canvas); on a GPU that is a few milliseconds a batch, on a
CPU it is most of the batch's time. On a CPU the loader's read threads call
``resample_record`` instead, per record, on pixels they have just read or decoded: the same
box and flip (the draw is made once, before any pixel is read), the same filter (an
antialiased triangle whose taps stop at the record's own edge).

Where the box is no larger than the output on either axis (most RandomResizedCrop boxes on a
pack packed near the output size, and its centre crops), Pillow's filter is plain bilinear
interpolation, and OpenCV computes it at the box's own fractional centres
(``imgpack.reader.warp``, the ``cpu`` extra): within a level of Pillow's, about twice as fast
as torch's kernel. ``IMGPACK_OPENCV=0`` turns it off.

Every other box (and every box without OpenCV) goes to torch's uint8 antialiased bilinear
resample (``interpolate``'s op: vectorised, channels last, the GIL released), 3-5x faster than
Pillow's scalar fixed point on a crop. It takes whole-pixel inputs only, and rounding a
fractional box to whole pixels moves the crop by up to half a record pixel, which costs far
more than the fidelity contract's 0.5 dB; but it places output j of an input starting at
pixel x0 at x0 + (j + 1/2) s for the scale s it is given. With the box's own scale, outputs
k .. k + S - 1 fall on the box's centres when x0 = left - k s; ``_grid`` picks the first k
(of ``_TRIES``) that brings x0 within ``ALIGN`` of a whole pixel, the op is asked for those
k + S outputs, and the first k are thrown away. Where no k does, the axis is read mirrored
(``_axis``: the grid then starts at the box's other end, another offset); an axis neither
way aligns goes to Pillow, which resamples a fractional box exactly, three to four times
slower (of RandomResizedCrop boxes on a fit 256 pack, about one crop in twenty-five has such
an axis; a box whose scale is near a fraction of small denominator, such as 2/3, meets few
offsets). The output is the exact resample's filter on a grid misplaced by at most ``ALIGN``
record pixels (docs/benchmarks.md measures what that costs against the photograph:
hundredths of a dB).

Only the part of the record that the filter reaches is handed to either kernel (the box
widened by the filter's support, within the record), so a crop costs what its output and
its box cost, not what the record costs. Pillow is imported on its first use, so
importing the reader still never loads it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from imgpack.errors import InvalidArgumentError
from imgpack.jit import compiled

__all__ = ["ALIGN", "reach", "resample_record"]

_MODES = {1: "L", 3: "RGB"}
ALIGN = 0.05
"""Record pixels: how far torch's grid may sit from the box's own (see the module docstring)."""
_TRIES = 128  # values of k tried per axis; each costs an output row or column when chosen


def reach(lo: float, hi: float, size: int, extent: int) -> tuple[int, int]:
    """[first, last) pixels of a record ``extent`` pixels long that Pillow's BILINEAR resample
    of the span [lo, hi) to ``size`` pixels reads: the span widened by the filter's support
    (one output pixel's span when shrinking, else one pixel) and a pixel of margin."""
    support = max((hi - lo) / size, 1.0)
    return max(math.floor(lo - support) - 1, 0), min(math.ceil(hi + support) + 1, extent)


def _found(x: Any) -> str:
    return f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__


def _checked(src: Any, box: Any, size: Any, out: Any) -> tuple[float, float, float, float]:
    if not isinstance(src, np.ndarray) or src.dtype != np.uint8 or src.ndim != 3:
        raise InvalidArgumentError(f"src should be a uint8 (h, w, C) array, found {_found(src)}")
    h, w, c = src.shape
    if c not in _MODES or not h or not w:
        raise InvalidArgumentError(f"src should have 1 or 3 channels and pixels, found {src.shape}")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise InvalidArgumentError(f"size should be a positive int, found {size!r}")
    want = (int(size), int(size), c)
    if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.shape != want:
        raise InvalidArgumentError(f"out should be a uint8 {want} array, found {_found(out)}")
    if not out.flags.writeable:
        raise InvalidArgumentError("out should be writable, found a read-only array")
    try:
        left, top, right, bottom = (float(v) for v in box)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"box should be 4 numbers, found {box!r}") from None
    if not all(math.isfinite(v) for v in (left, top, right, bottom)):
        raise InvalidArgumentError(f"box should be finite, found {box!r}")
    # a box drawn inside the record may overshoot its edge by float noise: Pillow refuses that
    left, right = min(max(left, 0.0), w), min(max(right, 0.0), w)
    top, bottom = min(max(top, 0.0), h), min(max(bottom, 0.0), h)
    return left, top, max(right, left), max(bottom, top)


def _grid(lo: float, hi: float, size: int, extent: int) -> tuple[int, int, int] | None:
    """(x0, x1, k) for one axis of torch's resample (see the module docstring): the input
    [x0, x1) (x0 < 0: the record's first pixel repeated), whose outputs k .. k + size - 1
    are the box's within ``ALIGN``; None where no k of ``_TRIES`` is.

    The input holds every tap Pillow's filter weighs for those outputs at the centres torch
    gives them (a tap it lacked would be cut from torch's filter). Its start falls left of
    the record where those taps stay inside it (the repeated pixels are then read only by
    the k outputs thrown away), or where the box is enlarged: a filter of support 1 centred
    in the edge pixel's first half then weighs the repeated edge pixel as Pillow's, clipped
    at the edge, weighs the edge pixel alone (both give that pixel), so a grid moved up to
    ``ALIGN`` outward samples the record as Pillow would at the edge itself. A shrunk box's
    filter that Pillow clips at the edge is matched only by an input starting there."""
    if hi <= lo:
        return None
    s = (hi - lo) / size
    support = max(s, 1.0)
    for k in range(_TRIES):
        start = lo - k * s
        x0 = math.floor(start + 0.5)
        if abs(start - x0) > ALIGN:
            continue
        # the taps Pillow's filter weighs for torch's first and last kept outputs, whose
        # centres are the box's moved by x0 - start, as Pillow computes them
        first = lo + x0 - start + 0.5 * s - support + 0.5
        if x0 < 0 and s > 1 and first < 0:
            return None  # Pillow clips this filter at the edge, as only x0 = 0 would
        if x0 <= max(int(first), 0):
            return x0, min(extent, int(hi + x0 - start - 0.5 * s + support + 0.5) + 1), k
    return None


def _axis(lo: float, hi: float, size: int, extent: int) -> tuple[int, int, int, bool] | None:
    """(x0, x1, k, mirrored) for one axis: ``_grid``'s input in record pixels, and whether
    torch reads it mirrored. The mirror (the record read from its far edge) starts the grid
    at the box's other end: another offset to align where the first gives none, and room
    for k where the box touches the near edge. None where neither aligns."""
    grid = _grid(lo, hi, size, extent)
    if grid is not None:
        return (*grid, False)
    grid = _grid(extent - hi, extent - lo, size, extent)
    if grid is not None:
        return extent - grid[1], extent - grid[0], grid[2], True
    return None


def _region(src: np.ndarray, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
    """src[y0:y1, x0:x1], compact, writable and of positive strides (torch warns of a
    read-only array and refuses a negative stride, which numpy keeps on a view of one row
    and calls contiguous): a copy unless it is all three already, its edge rows and columns
    repeated where the span leaves the record (a grid that starts before its edge: ``_grid``)."""
    h, w, c = src.shape
    if y0 >= 0 and x0 >= 0 and y1 <= h and x1 <= w:  # within the record
        view = src[y0:y1, x0:x1]
        ready = view.flags.c_contiguous and view.flags.writeable and min(view.strides) >= 0
        return view if ready else view.copy()
    top, left = max(-y0, 0), max(-x0, 0)
    bottom, right = y1 - y0 - max(y1 - h, 0), x1 - x0 - max(x1 - w, 0)  # buf's last inside
    buf = np.empty((y1 - y0, x1 - x0, c), dtype=np.uint8)
    buf[top:bottom, left:right] = src[max(y0, 0) : min(y1, h), max(x0, 0) : min(x1, w)]
    buf[:top], buf[bottom:] = buf[top], buf[bottom - 1]
    buf[:, :left], buf[:, right:] = buf[:, left : left + 1], buf[:, right - 1 : right]
    return buf


def _image(region: np.ndarray) -> Any:
    """``region`` (rows, cols, C), compact, as a Pillow image."""
    from PIL import Image

    rows, cols, c = region.shape
    mode = _MODES[c]
    return Image.frombuffer(mode, (cols, rows), region, "raw", mode, 0, 1)


def _pillow(region: np.ndarray, box: tuple[float, ...], width: int, height: int) -> np.ndarray:
    """Pillow's exact resample of ``box`` (in ``region`` pixels) to ``width`` x ``height``:
    an axis whose box is the whole region and whose length stays is left untouched (Pillow
    skips its pass)."""
    from PIL import Image

    resized = _image(region).resize((width, height), Image.Resampling.BILINEAR, box=box)
    return np.array(resized).reshape(height, width, region.shape[2])


def resample_record(
    src: np.ndarray, box: Any, size: int, flip: bool, out: np.ndarray
) -> np.ndarray:
    """The BILINEAR resample (Pillow's ``resize((size, size), BILINEAR, box=box)``) of one
    record to ``size`` x ``size``, mirrored left-right when ``flip``, written into ``out``
    (returned).

    ``src``: the record, uint8 (h, w, C), C = 1 or 3, of any strides (a slot of a canvas,
    a view of a mapped record, a decoded buffer). ``box``: (left, top, right, bottom) in
    ``src`` pixels, fractional (``Draw.crop``). ``out``: uint8 (size, size, C), writable,
    of any strides (a slot of a (B, size, size, C) batch, a mirrored view). Each output
    pixel is the filter's weighted sum at a point within ``ALIGN`` record pixels of
    Pillow's, to within a level of rounding.
    """
    left, top, right, bottom = _checked(src, box, size, out)
    size, flip, (h, w, _) = int(size), bool(flip), src.shape
    if right - left <= size and bottom - top <= size:  # enlarged: OpenCV's, where it is
        opencv = compiled("imgpack.reader.warp", "IMGPACK_OPENCV")
        if opencv is not None and size < opencv.LIMIT:
            return opencv.warp_record(src, (left, top, right, bottom), size, flip, out)
    cols, rows = _axis(left, right, size, w), _axis(top, bottom, size, h)
    x0, x1 = cols[:2] if cols else reach(left, right, size, w)
    y0, y1 = rows[:2] if rows else reach(top, bottom, size, h)
    pixels = _region(src, y0, y1, x0, x1)
    if cols is None or rows is None:  # Pillow resamples the axes torch cannot align
        lx, rx = (left - x0, right - x0) if cols is None else (0, x1 - x0)  # whole: untouched
        ty, by = (top - y0, bottom - y0) if rows is None else (0, y1 - y0)
        width, height = size if cols is None else x1 - x0, size if rows is None else y1 - y0
        pixels = _pillow(pixels, (lx, ty, rx, by), width, height)
    image = torch.from_numpy(pixels)
    mirrored = [d for d, axis in ((0, rows), (1, cols)) if axis and axis[3]]
    if mirrored:
        image = image.flip(mirrored)
    # (1, C, h, w) channels last: the layout torch's vectorised uint8 kernel takes
    image = image[None].permute(0, 3, 1, 2)
    if cols or rows:
        image = _resample(image, rows, cols, size, (bottom - top) / size, (right - left) / size)
    ky, kx = rows[2] if rows else 0, cols[2] if cols else 0
    crop = image[0, :, ky : ky + size, kx : kx + size].permute(1, 2, 0)
    back = [d for d, turn in ((0, 0 in mirrored), (1, (1 in mirrored) != flip)) if turn]
    crop = crop.flip(back) if back else crop  # the mirrored axes back, and the flip
    if min(out.strides) < 0:  # torch takes no negative strides: numpy writes those
        np.copyto(out, crop.numpy())
    else:
        torch.from_numpy(out).copy_(crop)
    return out


def _resample(image: torch.Tensor, rows: Any, cols: Any, size: int, sy: float, sx: float):
    """torch's antialiased bilinear resample of (1, C, h, w) ``image`` along the axes ``_axis``
    aligned (``rows``, ``cols``; None: Pillow's, left as they are) at the box's scales
    (``sy``, ``sx`` record pixels per output pixel): k + ``size`` outputs each, the ones
    kept. The op is given both the scale and the output count (``interpolate`` derives one
    from the other, and would compute the outputs past the box too); an axis whose output
    is as long as its input is copied by the op whatever its scale, so such an axis gets
    one output more."""
    n = image.shape[2:]
    out = [a[2] + size + (a[2] + size == length) if a else length for a, length in
           zip((rows, cols), n)]  # fmt: skip
    zoom = [1 / s if a else 1.0 for a, s in ((rows, sy), (cols, sx))]
    return _AA(image, out, False, *zoom)


_AA = torch.ops.aten._upsample_bilinear2d_aa.default
"""The op under ``F.interpolate(..., mode="bilinear", antialias=True)``, called with the
output size and the scales both (aten's signature since torch 1.11)."""
