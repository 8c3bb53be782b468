"""GPU side: move uint8 batches to the device, then convert, normalise and augment there.

uint8 crosses the bus (4x fewer bytes than float32) and the per-pixel float work
runs on the device, vectorised over the batch. Everything here also runs on
device "cpu", which is how it is tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from imgpack.errors import InvalidArgumentError

__all__ = ["to_device", "pin_batch", "DeviceTransform"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def to_device(
    batch: tuple[torch.Tensor, ...], device: Any, *, non_blocking: bool = True
) -> tuple[torch.Tensor, ...]:
    """Copy (uint8 images, labels[, targets]) to ``device``; tensors already there come back
    as they are.

    ``non_blocking`` overlaps the copy with compute only when the source is pinned
    (see ``pin_batch``); from pageable memory the copy is simply synchronous.
    Memory format is preserved, so channels_last batches stay channels_last. The source
    batch may be dropped at once: pinned memory from torch's caching host allocator is
    reused only after the copy out of it has completed. ``make_loader(device=...)`` does
    this for you, on a side stream.
    """
    device = torch.device(device)
    return tuple(t.to(device, non_blocking=non_blocking) for t in batch)


def pin_batch(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Page-lock a batch for async copies when CUDA is available; otherwise return it as is."""
    if not torch.cuda.is_available():
        return batch
    return tuple(t if t.is_pinned() else t.pin_memory() for t in batch)


class DeviceTransform:
    """uint8 (B, 3, H, W) -> float on the same device: optional crop and flip, then normalise.

    ``mean``/``std`` are per channel on the 0..1 scale (the index's stats).
    ``crop=(h, w)`` takes a random window per sample; ``flip`` mirrors each
    sample left-right with probability 1/2. Both run as one gather over the
    batch, on uint8, before conversion. The offsets drawn for the last call are
    in ``last_params`` (top, left, flip tensors). Arithmetic is float32 (float64
    for a float64 ``dtype``) and rounded to ``dtype`` once at the end.
    """

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        *,
        dtype: torch.dtype = torch.float32,
        crop: tuple[int, int] | None = None,
        flip: bool = False,
        channels_last: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        mean, std = [float(m) for m in mean], [float(s) for s in std]
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise InvalidArgumentError(
                f"mean and std should be 3 numbers each with std > 0, found {mean} and {std}"
            )
        if dtype not in _FLOATS:
            raise InvalidArgumentError(f"dtype should be a floating dtype, found {dtype}")
        if crop is not None:
            crop = tuple(crop)
            if len(crop) != 2 or not all(isinstance(c, int) and c > 0 for c in crop):
                raise InvalidArgumentError(f"crop should be (height, width) > 0, found {crop}")
        self.mean, self.std, self.dtype = tuple(mean), tuple(std), dtype
        self.crop, self.flip, self.channels_last = crop, bool(flip), channels_last
        self.generator = generator
        # (x/255 - mean)/std == x*scale + shift, folded in float64 once
        self._scale = [1.0 / (255.0 * s) for s in std]
        self._shift = [-m / s for m, s in zip(mean, std)]
        self._consts: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self.last_params: dict[str, torch.Tensor] | None = None

    @classmethod
    def from_dataset(cls, ds: Any, **kw: Any) -> DeviceTransform:
        """Normalise with the mean/std the packer computed for ``ds``."""
        return cls(ds.mean, ds.std, **kw)

    def __repr__(self) -> str:
        return (
            f"DeviceTransform(mean={self.mean}, std={self.std}, dtype={self.dtype}, "
            f"crop={self.crop}, flip={self.flip}, channels_last={self.channels_last})"
        )

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.dim() != 4:
            found = (
                f"{images.dtype} {tuple(images.shape)}"
                if isinstance(images, torch.Tensor)
                else type(images).__name__
            )
            raise InvalidArgumentError(f"expected a uint8 (B, 3, H, W) tensor, found {found}")
        if images.shape[1] != 3:
            raise InvalidArgumentError(
                f"expected 3 channels in dim 1, found shape {tuple(images.shape)}"
            )
        if self.crop is not None or self.flip:
            images = self._crop_flip(images)
        else:
            self.last_params = None
        work = torch.float64 if self.dtype == torch.float64 else torch.float32
        scale, shift = self._constants(images.device, work)
        out = images.to(work).mul_(scale).add_(shift)
        if out.dtype != self.dtype:
            out = out.to(self.dtype)
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        return out.contiguous(memory_format=fmt)

    def _constants(
        self, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        key = (device, dtype)
        if key not in self._consts:
            self._consts[key] = tuple(
                torch.tensor(v, dtype=dtype, device=device).view(1, 3, 1, 1)
                for v in (self._scale, self._shift)
            )
        return self._consts[key]

    def _draw(self, high: int, n: int, device: torch.device) -> torch.Tensor:
        gen = self.generator
        where = gen.device if gen is not None else device
        return torch.randint(0, high, (n,), generator=gen, device=where).to(device)

    def _crop_flip(self, x: torch.Tensor) -> torch.Tensor:
        """One advanced-indexing gather does every sample's crop window and mirror."""
        b, _, h, w = x.shape
        ch, cw = self.crop if self.crop is not None else (h, w)
        if ch > h or cw > w:
            raise InvalidArgumentError(f"crop {ch}x{cw} is larger than the {h}x{w} images")
        dev = x.device
        top, left = self._draw(h - ch + 1, b, dev), self._draw(w - cw + 1, b, dev)
        flip = (
            self._draw(2, b, dev).bool()
            if self.flip
            else torch.zeros(b, dtype=torch.bool, device=dev)
        )
        self.last_params = {"top": top, "left": left, "flip": flip}
        rows = top[:, None] + torch.arange(ch, device=dev)
        step = torch.arange(cw, device=dev)
        cols = left[:, None] + torch.where(flip[:, None], cw - 1 - step, step)
        batch = torch.arange(b, device=dev)[:, None, None]
        # advanced indices split by a slice go first: the result is (B, ch, cw, 3)
        return x[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
