"""Per-sample boxed resize of a uint8 batch: Pillow's bilinear filter as two batched matmuls.

Pillow's ``Image.resize(size, BILINEAR, box=...)`` is separable: each output
column is a weighted sum of input columns, with a triangle filter whose support
is widened by the downscale factor (that widening is the antialiasing), centred
at ``box_left + (i + 0.5) * scale`` and normalised to sum 1 over the pixels
that exist. Those weights for every sample form a (B, S, W) column matrix and a
(B, S, H) row matrix; ``torch.bmm`` applies both to the whole batch at once, on
any device, with no loop over samples. Per-sample boxes of different sizes cost
nothing extra: the box is only in the weights. A mirror is the column matrix
read backwards, so the flip is free too.

Why matmuls and not ``affine_grid``/``grid_sample``: ``grid_sample`` has no antialias, so
it aliases as soon as a crop shrinks, and supersampling then averaging stays well short of
Pillow at several times the cost; the matmuls match Pillow at every scale, in the dense
batched form accelerators run fastest (``scripts/bench_augment.py``; docs/benchmarks.md).

Pillow rounds to uint8 between its two passes and works in fixed point; this
module does not, so it differs from Pillow by at most about one level. (With
``torch.backends.cuda.matmul.allow_tf32`` on, CUDA runs the matmuls in TF32, whose
relative rounding is worth up to a few tenths of a level.)
"""

from __future__ import annotations

import torch

__all__ = ["filter_weights", "resample_boxes"]


def filter_weights(
    lo: torch.Tensor,
    hi: torch.Tensor,
    out_size: int,
    in_size: int,
    dtype: torch.dtype,
    extent: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B, out_size, in_size) bilinear weights mapping input span [lo, hi) to ``out_size`` pixels.

    ``lo``/``hi`` are (B,) float tensors in input pixel units (pixel j covers
    [j, j + 1)). Rows sum to 1 over the pixels inside the image, as in Pillow's
    ``precompute_coeffs`` (support 1 * max(scale, 1), centre (i + 0.5) * scale + lo).
    ``extent`` (B,): each sample's image ends there (a record smaller than the batch's
    canvas): pixels from it on get no weight, exactly as Pillow's border.
    """
    dev = lo.device
    lo, hi = lo.to(torch.float64), hi.to(torch.float64)
    scale = (hi - lo) / out_size
    width = scale.clamp_min(1.0)
    i = torch.arange(out_size, device=dev, dtype=torch.float64)
    centre = lo[:, None] + (i + 0.5) * scale[:, None]
    j = torch.arange(in_size, device=dev, dtype=dtype) + 0.5
    # the (B, S, in) tensor is built in the working dtype: float32 places a centre
    # to about 1e-4 px in a 2000 px record, far below what uint8 output resolves
    d = (j[None, None, :] - centre[:, :, None].to(dtype)).abs_()
    w = d.div_(width[:, None, None].to(dtype)).neg_().add_(1.0).clamp_min_(0.0)
    if extent is not None:
        inside = torch.arange(in_size, device=dev) < extent.to(dev)[:, None, None]
        w.mul_(inside)
    total = w.sum(-1, keepdim=True)
    return w.div_(total.clamp_min_(torch.finfo(dtype).tiny))


def resample_boxes(
    images: torch.Tensor,
    boxes: torch.Tensor,
    size: int,
    flip: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    extent: torch.Tensor | None = None,
) -> torch.Tensor:
    """uint8 (B, C, H, W), record-pixel boxes (B, 4) -> ``dtype`` (B, C, size, size), 0..255 scale.

    ``flip`` (bool (B,)) mirrors those samples left-right. ``extent`` (B, 2) (w, h): each
    sample's record fills only the top-left w x h of its slot (a canvas of records of
    several sizes); its taps stop there, weights renormalised over the record's pixels
    as Pillow does at the border, so no output pixel sees the padding. The result is a plain
    contiguous tensor in (B, size, C, size) memory order viewed as (B, C, size,
    size); the caller's normalisation writes it out in the memory format it wants.
    """
    b, c, h, w = images.shape
    boxes = boxes.to(device=images.device)
    ex, ey = (None, None) if extent is None else torch.as_tensor(extent).unbind(1)
    wx = filter_weights(boxes[:, 0], boxes[:, 2], size, w, dtype, ex)  # (B, S, W)
    wy = filter_weights(boxes[:, 1], boxes[:, 3], size, h, dtype, ey)  # (B, S, H)
    if flip is not None:
        wx = torch.where(flip.to(images.device)[:, None, None], wx.flip(1), wx)
    # (B, H, C, W) memory: the column pass contracts the last axis, the row pass the first
    x = torch.empty((b, h, c, w), dtype=dtype, device=images.device)
    x.copy_(images.permute(0, 2, 1, 3))
    t = torch.bmm(x.view(b, h * c, w), wx.transpose(1, 2))  # (B, H*C, S) = (B, H, C, S)
    out = torch.bmm(wy, t.view(b, h, c * size))  # (B, S, C*S) = (B, Sy, C, Sx)
    return out.view(b, size, c, size).permute(0, 2, 1, 3)
