"""JPEG records decoded at the scale each crop needs: the loader draws the crops first.

With ``make_loader(jpeg_ds, transform=DeviceTransform.train(...))`` (or ``.eval``), a
batch's crops are drawn before any record is read (``DeviceTransform.draw``), each record is
decoded at the largest DCT scale denominator of ``jpeg.PICK_SCALES`` (1 or 2) that still
leaves its crop box four times the output size (``jpeg.pick_scales``; ``jpeg.GAP`` says
why four times and why not 1/4 or 1/8; lowered by ``jpeg.exact_scale`` for tiny records),
into a canvas just large enough for the batch's decoded records, and the transform applies
the draw in decoded pixels (``Draw.at_scales``).
A 2048 px record's eval crop to 224 (a 1792 px box) decodes at 1/2, as does a 1024 px
one's to 112 (an 896 px box): less to decode, to copy to the device and to resample,
within 0.5 dB of the full decode.

``ScaledPlan`` wraps the loader's sampler: each batch of indices becomes a ``Planned``
batch, drawn in batch order from a generator of its own, seeded from one number drawn when
the pass starts (``iter(loader)``, in the consumer's thread) from the transform's
generator, else torch's. So the draws do not depend on which thread or process decodes
the batch, or when: ``torch.manual_seed`` (or the transform's generator) reproduces a run,
in-process and workers mode give the same batches, and the consumer's own use of torch's
generator in between cannot interleave with them.

A loader that decodes on the GPU (``imgpack.reader.devdecode``) plans with ``regions=True``:
the same draws, every record at full scale, each decoded only in its ``Planned.regions``
(the crop and the resample's reach), the draw shifted into those regions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

from imgpack.reader import devdecode
from imgpack.reader.augment import Draw
from imgpack.reader.jpeg import exact_scale, pick_scales

__all__ = ["Planned", "ScaledPlan", "plan_batch"]

_MIX = 0x9E3779B97F4A7C15  # odd: batch k's seed is the pass seed + k * _MIX (mod 2**64)


class Planned(NamedTuple):
    """One batch before it is read: its records, each one's DCT scale denominator, and its
    draw already in decoded pixels (``Draw.at_scales``); ``regions``: int64 (B, 4), the
    part of each record to decode (None: all of it; ``devdecode.regions``)."""

    idx: np.ndarray
    scales: np.ndarray
    draw: Draw
    regions: np.ndarray | None = None

    @property
    def canvas(self) -> tuple[int, int]:
        """(H', W'): the smallest canvas every decoded record of the batch fits in."""
        sizes = self.draw.sizes
        if not len(sizes):
            return 1, 1
        return int(sizes[:, 1].max()), int(sizes[:, 0].max())


def plan_batch(
    transform: Any,
    idx: np.ndarray,
    hw: tuple[int, int],
    generator: torch.Generator | None,
    regions: bool = False,
) -> Planned:
    """Draw ``transform``'s crops of records ``idx`` (in an ``hw`` canvas) and pick each
    record's scale for an output of ``transform.size`` (``regions``: full scale, and the
    region of each record to decode)."""
    draw = transform.draw(idx, hw, generator=generator)
    idx = np.asarray(idx, dtype=np.int64)
    if regions:
        box, shifted = devdecode.regions(draw)
        return Planned(idx, np.ones(len(idx), dtype=np.int64), shifted, box)
    want = pick_scales(draw.crop, draw.size, draw.size)
    scales = exact_scale(draw.sizes, want)
    return Planned(idx, scales, draw.at_scales(scales))


class ScaledPlan:
    """The sampler's batches as ``Planned`` ones (see the module docstring).

    ``plan(epoch, start)`` begins a pass, as on the ``OrderSampler`` it wraps, and draws the
    pass's seed; every ``iter()`` until the next ``plan`` yields the same batches (a
    DataLoader makes its sampler's iterator twice when it starts its workers).
    """

    def __init__(
        self, sampler: Any, transform: Any, hw: tuple[int, int], regions: bool = False
    ) -> None:
        self.sampler, self.transform, self.hw = sampler, transform, tuple(hw)
        self.regions = regions  # plan for a GPU decode (devdecode): regions, full scale
        self.seed = 0

    def __len__(self) -> int:
        return len(self.sampler)

    def plan(self, epoch: int, start: int) -> None:
        """Set the epoch and first batch of the next ``iter()``, and draw its seed."""
        self.sampler.plan(epoch, start)
        gen = self.transform.generator
        where = gen.device if gen is not None else torch.device("cpu")
        self.seed = int(torch.randint(0, 2**63 - 1, (1,), generator=gen, device=where).item())

    def __iter__(self) -> Iterator[Planned]:
        seed = self.seed
        for k, idx in enumerate(self.sampler):
            g = torch.Generator().manual_seed((seed + k * _MIX) % 2**64)
            yield plan_batch(self.transform, idx, self.hw, g, self.regions)
