"""The plan stage: which records each batch reads, and the crops drawn before they are read;
and ``Batch``, the one type a batch has on its way through the loader's stages.

The plan makes a ``Batch`` (which records, in what canvas, with the crops drawn for them),
the read stage fills it (images, labels, targets), the device stages replace its images,
and ``output`` gives the user their tuple. A ``Batch`` crosses from worker processes as it
is (its tensors through shared memory); torch's DataLoader pins it through its
``pin_memory`` method, the hook torch documents for custom batch types.

``Plan`` is the epoch order (``imgpack.reader.order``) as a torch sampler whose items are
whole batches: each batch's records as a ``Batch`` request (a DataLoader built with
``batch_size=None`` hands each to its dataset, and frameworks that set the epoch on
``loader.sampler`` find ``set_epoch`` here). With
``DeviceTransform.train``/``.eval`` it also draws the batch's crops first
(``DeviceTransform.draw``), which the read stage needs before it reads:

``Drawn``    the crops in record pixels; the records are read whole (raw and yuv420 packs).
``Scaled``   a JPEG record is decoded at the largest DCT scale (``jpeg.pick_scales``) that
             still leaves its crop ``jpeg.GAP`` times the output, into a canvas just large
             enough for the batch; the draw is moved into decoded pixels (decoded pixel x'
             shows record pixels [x' d, (x' + 1) d): ``jpeg.scaled_size``).

Every random draw the loader applies (the crops of ``DeviceTransform.train``, the windows
and flips of a ``DeviceTransform`` built with ``crop=`` or ``flip=``) comes from the batch's
own generator (``Batch.generator``), seeded from (``draw_seed``, rank, epoch, batch), where
``draw_seed`` is one number drawn when the loader is built (``draw_seed``, below), from the
transform's generator, else from ``make_loader``'s ``seed=``, else from torch's. So the
draws, like the order, are a pure function of the batch's place in the run: they depend on
neither the device, the pack's codec, the thread or process that reads the batch, nor when
it does; ``seed=`` or ``torch.manual_seed`` reproduces a run, in-process, workers and
resident loaders give the same batches, and a run resumed from ``loader.state_dict()`` draws
what it would have drawn. The rank is in the seed because ranks are usually seeded alike:
without it, batch k of every rank would get the same boxes and flips.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from imgpack.reader.jpeg import pick_scales, scaled_size
from imgpack.reader.order import EpochOrder

__all__ = ["Plan", "Drawn", "Scaled", "Batch", "draw_seed", "pinned", "tree_map"]

_DRAWS = 1  # the loader's seed feeds the order as it is; the draws take this stream of it


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
    slot in ``images``; None when every record fills the canvas. ``seed``: the seed of the
    batch's random draws (``generator``); None where the loader's transform draws nothing at
    random.
    """

    records: np.ndarray
    hw: tuple[int, int]
    draw: Any = None  # a transform.Draw (transform imports this module)
    scales: np.ndarray | None = None
    images: Any = None
    rest: tuple | None = ()
    sizes: np.ndarray | None = None
    seed: int | None = None

    def generator(self) -> torch.Generator | None:
        """A generator of this batch's random draws, the same wherever and whenever it is
        made (None where the batch has no ``seed``)."""
        return None if self.seed is None else torch.Generator().manual_seed(self.seed)

    def filled(self, images: Any, *rest: Any) -> Batch:
        """This batch, now holding ``images`` (and ``rest``, where given: a read stage's
        labels[, targets], or None for a collated batch): a batch has one owner at a time,
        the stage it is in."""
        self.images = images
        if rest:
            self.rest = rest[0]
        return self

    def pin_memory(self) -> Batch:
        """Every tensor of the batch page-locked (torch's DataLoader calls this)."""
        return replace(self, images=pinned(self.images), rest=pinned(self.rest))

    def output(self) -> Any:
        """What the user's loop receives: (images, labels[, targets])."""
        return self.images if self.rest is None else (self.images, *self.rest)


def tree_map(fn: Any, obj: Any) -> Any:
    """``obj`` with every tensor in it replaced by ``fn(tensor)``: tuples (named ones too),
    lists and dicts are walked, anything else comes back as it is."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return type(obj)(*(tree_map(fn, o) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(tree_map(fn, o) for o in obj)
    if isinstance(obj, dict):
        return {k: tree_map(fn, v) for k, v in obj.items()}
    return obj


def pinned(obj: Any) -> Any:
    """``obj`` with every tensor in it page-locked, as torch's pin thread does."""
    return tree_map(lambda t: t if t.is_pinned() else t.pin_memory(), obj)


class Drawn:
    """The transform's crops of each batch, in record pixels, over records read whole."""

    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __call__(self, batch: Batch) -> Batch:
        batch.draw = self.transform.draw(batch.records, batch.hw, generator=batch.generator())
        return batch


class Scaled(Drawn):
    """JPEG records each decoded at the scale its crop needs (module docstring)."""

    def __call__(self, batch: Batch) -> Batch:
        draw = self.transform.draw(batch.records, batch.hw, generator=batch.generator())
        scales = pick_scales(draw.crop, draw.size, draw.size)
        w, h = scaled_size(draw.sizes[:, 0], draw.sizes[:, 1], scales)
        batch.draw = draw._replace(crop=draw.crop / scales[:, None], sizes=np.stack([w, h], 1))
        batch.hw = (int(h.max()), int(w.max())) if len(w) else (1, 1)  # the smallest canvas
        batch.scales, batch.sizes = scales, batch.draw.sizes
        return batch


def draw_seed(seed: int | None, generator: torch.Generator | None) -> int:
    """The ``draw_seed`` of a loader whose transform draws at random (module docstring): from
    the transform's ``generator``, else the loader's ``seed``, else torch's generator."""
    if generator is None and seed is not None:  # the draws' own stream of the loader's seed
        state = np.random.SeedSequence((seed, _DRAWS)).generate_state(1, np.uint64)
        return int(state[0] >> np.uint64(1))
    where = generator.device if generator is not None else torch.device("cpu")
    return int(torch.randint(0, 2**63 - 1, (1,), generator=generator, device=where))


@dataclass(eq=False)
class Plan(Sampler):
    """Each batch of the order's pass as a ``Batch`` request (see the module docstring).

    ``begin()`` starts a pass; every ``iter()`` until the next ``begin`` yields
    the same batches (a DataLoader makes its sampler's iterator twice when it starts its
    workers). ``draws``: None (the records, in the pack's ``bound`` canvas, each of its
    ``record_sizes``: int64 (N, 2), or None where every record fills the bound), or
    ``Drawn`` or ``Scaled``. ``draw_seed`` (``draw_seed()``): where the transform draws at
    random, every batch gets its ``seed``; None where it draws nothing at random.
    """

    order: EpochOrder
    bound: tuple[int, int]
    draws: Drawn | None
    record_sizes: np.ndarray | None = None
    draw_seed: int | None = None
    epoch: int = 0  # the pass's, from ``begin``
    start: int = 0

    def __len__(self) -> int:
        return len(self.order)

    def begin(self) -> tuple[int, int]:
        """Start the order's next pass (``EpochOrder.begin_pass``): the epoch and first batch
        of every ``iter()`` until the next ``begin``."""
        self.epoch, self.start = self.order.begin_pass()
        return self.epoch, self.start

    def set_epoch(self, epoch: int) -> None:
        """``PackLoader.set_epoch``, for frameworks that set the epoch on ``loader.sampler``.

        Lightning does, each epoch; without it a run resumed from an epoch-end checkpoint
        (whose loader state Lightning does not reload) replayed epoch 0's order.
        """
        self.order.set_epoch(epoch)

    def _seed(self, epoch: int, batch: int) -> int | None:
        """The ``Batch.seed`` of batch ``batch`` of ``epoch`` (module docstring)."""
        if self.draw_seed is None:
            return None
        entropy = np.random.SeedSequence((self.draw_seed, self.order.rank, epoch, batch))
        return int(entropy.generate_state(1, np.uint64)[0])

    def __iter__(self) -> Iterator[Batch]:
        sizes, epoch = self.record_sizes, self.epoch
        for k, idx in enumerate(self.order.batches(epoch, self.start), self.start):
            own = None if sizes is None else sizes[idx]  # (idx: int64 already)
            batch = Batch(idx, self.bound, sizes=own, seed=self._seed(epoch, k))
            yield batch if self.draws is None else self.draws(batch)
