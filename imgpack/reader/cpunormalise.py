"""A batch of uint8 crops made on the CPU, normalised into the float tensor training takes.

``DeviceTransform`` ends with ``x * scale + shift`` per channel (``(x/255 - mean)/std``
folded), written as ``torch.mul(images, scale (1, C, 1, 1), out=channels_last)``: on a GPU
that is one fused pass, but on a CPU torch broadcasts the per-channel constants along the
innermost dimension of channels_last memory (C, of size 1 or 3), where it does not
vectorise. The crops of a CPU batch are (B, S, S, C) in memory already (channels_last), so
here the batch is read as B*S rows of S*C values and the constants as one row of S*C (each
channel's repeated S times): the same products and sums, in the same order and precision,
bit for bit, in passes that vectorise.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from imgpack.errors import InvalidArgumentError

__all__ = ["normalise"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def normalise(
    pixels: torch.Tensor, scale: Sequence[float], shift: Sequence[float], dtype: torch.dtype
) -> torch.Tensor:
    """uint8 (B, H, W, C) -> ``dtype`` (B, C, H, W) channels_last: x * scale[c] + shift[c].

    Computed in float32 (float64 for a float64 ``dtype``) and rounded to ``dtype`` once at
    the end, as ``DeviceTransform`` does; ``scale``/``shift`` are its per-channel constants
    (one per channel, or one for all).
    """
    if not isinstance(pixels, torch.Tensor) or pixels.dtype != torch.uint8 or pixels.dim() != 4:
        found = (
            f"{pixels.dtype} {tuple(pixels.shape)}"
            if isinstance(pixels, torch.Tensor)
            else type(pixels).__name__
        )
        raise InvalidArgumentError(f"pixels should be a uint8 (B, H, W, C) tensor, found {found}")
    if dtype not in _FLOATS:
        raise InvalidArgumentError(f"dtype should be a floating dtype, found {dtype}")
    b, h, w, c = pixels.shape
    scale, shift = [float(v) for v in scale], [float(v) for v in shift]
    if len(scale) not in (1, c) or len(shift) != len(scale):
        raise InvalidArgumentError(
            f"scale and shift should be 1 or {c} numbers each, found {len(scale)} and {len(shift)}"
        )
    work = torch.float64 if dtype == torch.float64 else torch.float32
    out = torch.empty((b, h, w, c), dtype=work, device=pixels.device)
    rows = out.view(b * h, w * c)
    rows.copy_(pixels.reshape(b * h, w * c))
    per_pixel = c if len(scale) == c else 1
    for values, op in ((scale, rows.mul_), (shift, rows.add_)):
        row = torch.tensor(values, dtype=work, device=pixels.device).repeat(w * c // per_pixel)
        op(row)
    result = out.permute(0, 3, 1, 2)
    return result if work == dtype else result.to(dtype)
