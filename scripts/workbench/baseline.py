"""The per-file baseline: what most training code does today, for imgpack to be measured against.

An ImageFolder-style dataset that opens, decodes, resizes and crops one file
per ``__getitem__`` with Pillow, served by the common hand-written DataLoader
template (issue #3 item 8). It is deliberately naive: per-sample work in the
workers, default collate. The transform is the standard eval transform, done
with Pillow instead of torchvision (which imgpack does not depend on): shorter
side to ``size`` (bilinear, antialiased), then a centre crop to size x size,
with torchvision's ``Resize(size)`` + ``CenterCrop(size)`` arithmetic.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from imgpack.errors import InvalidArgumentError, SourceError
from imgpack.machine import usable_cores
from imgpack.packer.discover import discover

__all__ = ["PerFileImageDataset", "baseline_loader", "baseline_workers", "resize_center_crop"]


def resize_center_crop(img: Image.Image, size: int) -> Image.Image:
    """Shorter side to ``size``, then the central size x size square (torchvision's rounding)."""
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(size * long / short)
    new_w, new_h = (size, new_long) if w <= h else (new_long, size)
    if (new_w, new_h) != (w, h):
        img = img.resize((new_w, new_h), Image.Resampling.BILINEAR)  # antialiased when shrinking
    top = int(round((new_h - size) / 2.0))
    left = int(round((new_w - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


class PerFileImageDataset(torch.utils.data.Dataset):
    """``ds[i]`` -> (uint8 tensor (3, size, size), label), decoded from its file on every call.

    Files and labels follow the ImageFolder rule (``imgpack.packer.discover``):
    sorted class folders under ``src``, images found recursively.
    """

    def __init__(self, src: str | os.PathLike, *, size: int = 224) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InvalidArgumentError(f"size must be a positive number of pixels, got {size!r}")
        listing = discover(src, labels="folders")
        self.root: Path = listing.root
        self.size = size
        self.classes: list[str] = list(listing.classes)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples: list[tuple[str, int]] = list(listing.files)  # per-sample objects, as usual
        self.targets = [label for _, label in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        rel, label = self.samples[i]
        path = self.root / rel
        try:
            with Image.open(path) as img:
                rgb = resize_center_crop(img.convert("RGB"), self.size)
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            raise SourceError(f"{path}: cannot decode ({exc})") from exc
        pixels = torch.from_numpy(np.array(rgb, dtype=np.uint8))  # (H, W, 3), writable copy
        return pixels.permute(2, 0, 1), label  # like torchvision's PILToTensor: a CHW view


def baseline_workers() -> int:
    """``min(4, cores // 2)``, at least 1: the usual starting point for num_workers."""
    return max(1, min(4, usable_cores() // 2))


def baseline_loader(
    ds: torch.utils.data.Dataset, batch_size: int, *, num_workers: int | None = None
) -> torch.utils.data.DataLoader:
    """The common DataLoader template: shuffled, per-sample fetch, default collate.

    num_workers = min(4, cores // 2) (at least 1), prefetch_factor 4,
    persistent workers, drop_last, pin_memory only where CUDA is available.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidArgumentError(f"batch_size must be a positive int, got {batch_size!r}")
    if len(ds) < batch_size:
        raise InvalidArgumentError(
            f"batch_size {batch_size} is larger than the dataset ({len(ds)} images): "
            "with drop_last there would be no batch at all"
        )
    workers = baseline_workers() if num_workers is None else num_workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InvalidArgumentError(f"num_workers must be an int >= 1, got {workers!r}")
    return torch.utils.data.DataLoader(
        ds,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        prefetch_factor=4,
        persistent_workers=True,
        drop_last=True,
        pin_memory=torch.cuda.is_available(),
    )
