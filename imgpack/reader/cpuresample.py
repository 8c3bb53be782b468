"""One record's crop, resized on the CPU into its slot of a batch: Pillow's BILINEAR resample.

``DeviceTransform.train``/``.eval`` resample each sample's box as Pillow's
``Image.resize((S, S), BILINEAR, box=box)`` does (``imgpack.reader.resample``: two batched
matmuls, in float, over a whole canvas); on a GPU that is a few milliseconds a batch, on a
CPU it is most of the batch's time. On a CPU the loader's read threads call
``resample_record`` instead, per record, on pixels they have just read or decoded: the same
box and flip (the draw is made once, before any pixel is read), the same semantics (an
antialiased triangle filter whose taps stop at the record's own edge), computed by Pillow
itself in fixed point, so it is the truth the tests measure against, to within one level.

Why Pillow, the one reader module that imports it (lazily, on the first call, so importing
the reader still never loads Pillow): the boxes are fractional in record pixels (drawn in
source pixels, then mapped into the record), and Pillow resamples a fractional box exactly,
releasing the GIL while it does, so read threads scale. torch's uint8 antialiased
``interpolate`` takes whole-pixel crops only: rounding each box to whole pixels moves the
crop by up to half a record pixel, which costs far more than the fidelity contract's 0.5 dB
against the photograph; docs/benchmarks.md has the comparison.

Only the part of the record that the filter reaches is handed to Pillow (the box widened by
the filter's support, within the record), so a crop costs what its output and its box cost,
not what the record costs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from imgpack.errors import InvalidArgumentError

__all__ = ["reach", "resample_record"]

_MODES = {1: "L", 3: "RGB"}


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


def _image(region: np.ndarray) -> Any:
    """``region`` (rows, cols, C) as a Pillow image, from a compact copy unless it is one
    already (Pillow reads whole rows, so it cannot read a view's rows in place)."""
    from PIL import Image

    rows, cols, c = region.shape
    mode = _MODES[c]
    return Image.frombuffer(mode, (cols, rows), np.ascontiguousarray(region), "raw", mode, 0, 1)


def resample_record(
    src: np.ndarray, box: Any, size: int, flip: bool, out: np.ndarray
) -> np.ndarray:
    """Pillow's ``resize((size, size), BILINEAR, box=box)`` of one record, mirrored left-right
    when ``flip``, written into ``out`` (returned).

    ``src``: the record, uint8 (h, w, C), C = 1 or 3, of any strides (a slot of a canvas,
    a view of a mapped record, a decoded buffer). ``box``: (left, top, right, bottom) in
    ``src`` pixels, fractional (``Draw.crop``). ``out``: uint8 (size, size, C), of any
    strides (a slot of a (B, size, size, C) batch). Equal to Pillow's resample of the whole
    record to within one level (Pillow sees only the part its filter reaches, so its
    centres are computed from a shifted origin).
    """
    left, top, right, bottom = _checked(src, box, size, out)
    h, w, _ = src.shape
    x0, x1 = reach(left, right, size, w)
    y0, y1 = reach(top, bottom, size, h)
    image = _image(src[y0:y1, x0:x1])
    from PIL import Image

    resized = image.resize(
        (size, size), Image.Resampling.BILINEAR, box=(left - x0, top - y0, right - x0, bottom - y0)
    )
    if flip:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    np.copyto(out, np.asarray(resized).reshape(out.shape))
    return out
