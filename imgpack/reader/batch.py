"""``Batch``: the one type a batch has on its way through the loader's stages.

The plan stage makes it (which records, in what canvas, with the crops drawn for them), the
read stage fills it (the images, labels and targets), the device stages replace its
images (moved, converted, transformed), and ``output`` gives the user their tuple. Each
stage is chosen for the pack and the call when the loader is built (``imgpack.reader.
loader``), so a stage knows what its batches hold and never asks; what differs from one
pack to the next (its codec, whether its records fill the bound) is settled when a stage is
made.

A ``Batch`` crosses from worker processes as it is (its tensors through shared memory),
and torch's DataLoader pins it through its ``pin_memory`` method, the hook torch documents
for custom batch types.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from imgpack.reader.augment import Draw

__all__ = ["Batch", "pinned"]


@dataclass
class Batch:
    """One batch between two stages.

    ``records``: int64 (B,), the dataset positions. ``hw``: (H, W) that the images are laid
    out in (the pack's bound, or a smaller canvas a plan sized for this batch).
    ``draw``: the crops drawn before reading (``DeviceTransform.draw``), in the pixels of
    ``images``; ``scales``: each JPEG record's DCT scale denominator.
    ``images``: what the last stage left (a canvas tensor, a yuv canvas, RGB on the
    device ...). ``rest``: what follows the images in the
    user's tuple (labels[, targets]); None when ``images`` is a collated batch to hand over
    as it is. ``sizes``: int64 (B, 2), (w, h) of each record's pixels at the top-left of its
    slot in ``images``; None when every record fills the canvas.
    """

    records: np.ndarray
    hw: tuple[int, int]
    draw: Draw | None = None
    scales: np.ndarray | None = None
    images: Any = None
    rest: tuple | None = ()
    sizes: np.ndarray | None = None

    def filled(self, images: Any, rest: tuple | None) -> Batch:
        """This batch with what a read stage made of it."""
        return replace(self, images=images, rest=rest)

    def with_images(self, images: Any) -> Batch:
        return replace(self, images=images)

    def pin_memory(self) -> Batch:
        """Every tensor of the batch page-locked (torch's DataLoader calls this)."""
        return replace(self, images=pinned(self.images), rest=pinned(self.rest))

    def output(self) -> Any:
        """What the user's loop receives: (images, labels[, targets])."""
        return self.images if self.rest is None else (self.images, *self.rest)


def pinned(obj: Any) -> Any:
    """``obj`` with every tensor in it page-locked, as torch's pin thread does."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.is_pinned() else obj.pin_memory()
    if isinstance(obj, (tuple, list)):
        return type(obj)(pinned(o) for o in obj)
    if isinstance(obj, dict):
        return {k: pinned(v) for k, v in obj.items()}
    return obj
