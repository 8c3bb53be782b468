"""The crops' resampler: Pillow's BILINEAR ``resize(size, box=...)``, one per kind of device.

Pillow's ``Image.resize((S, S), BILINEAR, box=box)`` is the definition: separable, each
output pixel a weighted sum of record pixels, with a triangle filter whose support is
widened by the downscale factor (that widening is the antialiasing), centred at
``box_left + (i + 0.5) * scale`` and normalised to sum 1 over the pixels that exist.

On a device (``resample_boxes``), the weights for every sample form a (B, S, W) column
matrix and a (B, S, H) row matrix, and ``torch.bmm`` applies both to the whole batch at
once, with no loop over samples; a box of any size costs nothing extra (it is only in the
weights) and a mirror is the column matrix read backwards. ``grid_sample`` has no
antialias, so it aliases as soon as a crop shrinks; the matmuls match Pillow at every
scale, in float (no rounding between the passes, so within about a level of Pillow's fixed
point; with ``allow_tf32`` on, CUDA's TF32 adds a few tenths of a level).

On a CPU (``resample_record``), one record at a time, in the loader's threads or in
``DeviceTransform.apply`` over a batch's slots: the same crop however it is asked for. Where
the box is no larger than the output on either axis, Pillow's filter has a support of one
pixel: bilinear interpolation at the box's fractional centres (the edge pixel standing in
past the edge), which OpenCV's ``warpAffine`` computes exactly (OpenCV 5 places samples
exactly; OpenCV 4 quantised them to 1/32 pixel), in vectorised fixed point, at about the
cost of FFCV's ``INTER_AREA`` resize. Every other box is Pillow's own resample, exact by
definition. Both are a declared dependency (OpenCV 5 and Pillow); both are handed only the
part of the record the filter reaches (``reach``), so a crop costs what its box costs.
They are imported on the first crop, so importing the reader loads neither.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from imgpack.errors import MissingExtraError
from imgpack.reader.run import POOL

__all__ = ["reach", "filter_weights", "resample_boxes", "resample_record", "crop_each", "opencv"]

_LIMIT = 2**15 - 8  # pixels: OpenCV's remap holds coordinates in 16 bits; longer to Pillow


def reach(lo: float, hi: float, size: int, extent: int) -> tuple[int, int]:
    """[first, last) pixels of a record ``extent`` pixels long that the resample of the span
    [lo, hi) to ``size`` pixels reads: the span widened by the filter's support (one output
    pixel's span when shrinking, else one pixel) and a pixel of margin."""
    support = max((hi - lo) / size, 1.0)
    return max(math.floor(lo - support) - 1, 0), min(math.ceil(hi + support) + 1, extent)


def filter_weights(
    span: torch.Tensor, out_size: int, in_size: int, dtype: torch.dtype, extent: torch.Tensor
) -> torch.Tensor:
    """(B, out_size, in_size) bilinear weights mapping input span [lo, hi) to ``out_size`` pixels.

    ``span`` is a (B, 2) float tensor of (lo, hi) in input pixel units (pixel j covers
    [j, j + 1)). Rows sum to 1 over the pixels inside the image, as in Pillow's
    ``precompute_coeffs`` (support 1 * max(scale, 1), centre (i + 0.5) * scale + lo).
    ``extent`` (B,): each sample's image ends there (a record smaller than the batch's
    canvas): pixels from it on get no weight, exactly as Pillow's border.
    """
    dev = span.device
    lo, hi = span.to(torch.float64).unbind(1)
    scale = (hi - lo) / out_size
    width = scale.clamp_min(1.0)
    i = torch.arange(out_size, device=dev, dtype=torch.float64)
    centre = lo[:, None] + (i + 0.5) * scale[:, None]
    j = torch.arange(in_size, device=dev, dtype=dtype) + 0.5
    # the (B, S, in) tensor is built in the working dtype: float32 places a centre
    # to about 1e-4 px in a 2000 px record, far below what uint8 output resolves
    d = (j[None, None, :] - centre[:, :, None].to(dtype)).abs_()
    w = d.div_(width[:, None, None].to(dtype)).neg_().add_(1.0).clamp_min_(0.0)
    w.mul_(torch.arange(in_size, device=dev) < extent.to(dev)[:, None, None])
    return w.div_(w.sum(-1, keepdim=True).clamp_min_(torch.finfo(dtype).tiny))  # rows sum to 1


def resample_boxes(
    images: torch.Tensor,
    boxes: torch.Tensor,
    size: int,
    flip: torch.Tensor,
    dtype: torch.dtype,
    extent: torch.Tensor,
) -> torch.Tensor:
    """uint8 (B, C, H, W), record-pixel boxes (B, 4) -> ``dtype`` (B, C, size, size), 0..255 scale.

    ``flip`` (bool (B,)) mirrors those samples left-right. ``extent`` (B, 2) (w, h): each
    sample's record fills only the top-left w x h of its slot (a canvas of records of
    several sizes); its taps stop there, weights renormalised over the record's pixels
    as Pillow does at the border, so no output pixel sees the padding. The result is a plain
    contiguous tensor in (B, size, C, size) memory order viewed as (B, C, size, size).
    """
    b, c, h, w = images.shape
    boxes = boxes.to(device=images.device)
    ex, ey = torch.as_tensor(extent).unbind(1)
    wx = filter_weights(boxes[:, 0::2], size, w, dtype, ex)  # (B, S, W)
    wy = filter_weights(boxes[:, 1::2], size, h, dtype, ey)  # (B, S, H)
    wx = torch.where(flip.to(images.device)[:, None, None], wx.flip(1), wx)
    # (B, H, C, W) memory: the column pass contracts the last axis, the row pass the first
    x = images.permute(0, 2, 1, 3).to(dtype, memory_format=torch.contiguous_format)
    t = torch.bmm(x.view(b, h * c, w), wx.transpose(1, 2))  # (B, H*C, S) = (B, H, C, S)
    # the row pass: (B, S, C*S) = (B, Sy, C, Sx), viewed as (B, C, Sy, Sx)
    return torch.bmm(wy, t.view(b, h, c * size)).view(b, size, c, size).permute(0, 2, 1, 3)


def resample_record(
    src: np.ndarray, box: Any, size: int, flip: bool, out: np.ndarray
) -> np.ndarray:
    """Pillow's ``resize((size, size), BILINEAR, box=box)`` of one record, mirrored
    left-right when ``flip``, written into ``out`` (returned): the CPU's crop.

    ``src``: the record, uint8 (h, w, C), C = 1 or 3, of any strides (a slot of a canvas,
    a view of a mapped record, a decoded buffer). ``box``: (left, top, right, bottom) in
    ``src`` pixels, fractional (``Draw.crop``). ``out``: uint8 (size, size, C), writable
    rows of whole pixels (a slot of a batch), apart from ``src``. OpenCV's where the box is
    enlarged on both axes, Pillow's otherwise: within a level of each other (rounding),
    never depending on what else is installed.
    """
    h, w, c = src.shape
    # a box drawn inside the record may overshoot its edge by float noise: Pillow refuses that
    # (clamped, a drawn box still has left <= right and top <= bottom)
    left, right = (min(max(float(v), 0.0), w) for v in box[::2])
    top, bottom = (min(max(float(v), 0.0), h) for v in box[1::2])
    x0, x1 = reach(left, right, size, w)
    y0, y1 = reach(top, bottom, size, h)
    region, box = src[y0:y1, x0:x1], (left - x0, top - y0, right - x0, bottom - y0)
    enlarged = right - left <= size and bottom - top <= size and size < _LIMIT
    # OpenCV reads rows of whole pixels at any row stride, Pillow only compact rows (and
    # numpy may call a view of one row contiguous and keep its negative stride)
    rows = region.strides[1:] == (c, 1) and region.strides[0] >= region.shape[1] * c
    if not (rows and (enlarged or region.flags.c_contiguous)):
        region = region.copy()
    if enlarged:
        return _warp(region, box, size, flip, out)
    from PIL import Image  # Pillow's exact resample of the box

    image = Image.fromarray(region[..., 0] if c == 1 else region)  # L or RGB, not copied
    made = np.asarray(image.resize((size, size), Image.Resampling.BILINEAR, box=box))
    # OpenCV mirrors in one pass; numpy's copy of a mirrored view goes pixel by pixel
    # (three bytes at a time: about 40x slower, as long as the resample itself)
    np.copyto(out, (opencv().flip(made, 1) if flip else made).reshape(size, size, c))
    return out


def crop_each(
    pixels: Callable[[int], np.ndarray],
    boxes: np.ndarray,
    flips: np.ndarray,
    out: np.ndarray,
    threads: int,
) -> None:
    """Box i of float (B, 4) ``boxes``, in the (h, w, C) pixels ``pixels(i)`` gives, resampled
    into slot i of the (B, S, S, C) ``out``, mirrored where ``flips[i]``, on ``threads``
    threads: the one way a record's crop is made on a CPU (streamed or resident)."""
    box, flip = np.asarray(boxes, np.float64).tolist(), np.asarray(flips, bool).tolist()

    def work(i: int) -> None:
        resample_record(pixels(i), box[i], out.shape[1], flip[i], out[i])

    POOL.run(len(box), work, threads)


def _warp(
    region: np.ndarray, box: tuple[float, ...], size: int, flip: bool, out: np.ndarray
) -> np.ndarray:
    """OpenCV's bilinear samples at the centres of an enlarged ``box`` of ``region``, into
    ``out``."""
    cv2 = opencv()
    left, top, right, bottom = box
    sx, sy = (right - left) / size, (bottom - top) / size
    # output (j, i) reads the region at index (a + j dx, b + i sy): the box's centre
    # left + (j + 1/2) sx, less half a pixel (pixel x's centre is x + 1/2); mirrored, the
    # same centres from the right, read backwards (dx = -sx)
    a, b = left + 0.5 * sx - 0.5, top + 0.5 * sy - 0.5
    a, dx = (right - 0.5 * sx - 0.5, -sx) if flip else (a, sx)
    grid = np.array([[dx, 0.0, a], [0.0, sy, b]])  # (h, w, 1): OpenCV's one channel
    return cv2.warpAffine(region, grid, (size, size), out, borderMode=cv2.BORDER_REPLICATE,
                          flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP)  # fmt: skip


def opencv() -> Any:
    """cv2, checked to be OpenCV 5: a dependency of imgpack's CPU crops (and normalise),
    imported on the first of them (so importing the reader loads none). Another package's
    OpenCV 4 may be the one installed as cv2."""
    import cv2

    if int(cv2.__version__.split(".")[0]) < 5:
        raise MissingExtraError(
            f"imgpack's CPU crops need OpenCV 5 (OpenCV {cv2.__version__}; OpenCV 4 places "
            "warpAffine's samples to 1/32 pixel): pip install 'opencv-python-headless>=5'"
        )
    return cv2
