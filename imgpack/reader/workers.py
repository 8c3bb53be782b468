"""Workers mode: a torch ``DataLoader`` whose workers each gather one whole batch.

The sampler yields one index array per batch and ``batch_size=None`` turns off the
DataLoader's own batching, so a worker's fetch is ``_Batches[indices]``: one ``ds.gather``
(or, for a dataset with a per-sample transform, ``collate([ds[i] for i in indices])``).
The default collate never sees a gathered batch, and the dataset's ``__getitems__`` keeps
torch's contract for everyone else's DataLoader. A JPEG pack's records are decoded here, in
the workers (each on its share of the CPUs); a ``scaled.Planned`` batch, drawn in the main
process, is decoded at its scales into a canvas sized for it and comes back with its draw.
"""

from __future__ import annotations

import inspect
import random
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from imgpack.errors import InvalidArgumentError
from imgpack.machine import usable_cores
from imgpack.reader.indices import _empty_uint8, _samples
from imgpack.reader.options import WorkerOptions
from imgpack.reader.scaled import Planned

__all__ = ["build_dataloader", "default_workers", "DEFAULT_WORKERS", "DEFAULT_PREFETCH_FACTOR"]

# From docs/benchmarks.md: a packed batch needs no decoding, so worker processes only add a
# copy through shared memory (the in-process loader is the default); 2 workers beat 1 on 2 cores.
DEFAULT_WORKERS = 2  # at most this many worker processes (fewer on fewer cores)
DEFAULT_PREFETCH_FACTOR = 4  # batches in flight per worker


def default_workers() -> int:
    """Worker processes for workers mode: DEFAULT_WORKERS, capped by the usable cores."""
    return max(1, min(DEFAULT_WORKERS, usable_cores()))


class _Batches:
    """What the DataLoader's workers see: ``self[indices]`` is one (batch, records) pair."""

    def __init__(self, dataset: Any, collate: Callable[[list], Any] | None) -> None:
        self.dataset, self.collate = dataset, collate

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: Any) -> tuple[Any, Any]:
        if isinstance(indices, Planned):
            return self._decoded(indices), indices.draw
        idx = np.asarray(indices, dtype=np.int64)
        if self.collate is None:
            if not self.dataset.resident:  # cold: read the batch in parallel
                self.dataset.will_need(idx)
            batch = self.dataset.gather(idx)
        else:
            batch = self.collate(_samples(self.dataset, idx))
        return batch, idx  # numpy: pickled inline, not one more shared-memory tensor

    def _decoded(self, planned: Planned) -> tuple[torch.Tensor, ...]:
        """A JPEG pack's ``Planned`` batch, each record decoded at its scale."""
        ds, idx = self.dataset, planned.idx
        if not ds.resident:
            ds.will_need(idx)
        images = _empty_uint8((idx.size, *planned.canvas, ds.shape[2]))
        labels = torch.empty(idx.size, dtype=torch.int64)
        # the transform of a Planned batch reads only each record's extent: no zeroing
        ds.decode_into(idx, images.numpy(), labels.numpy(), planned.scales, pad=False)
        batch: tuple[torch.Tensor, ...] = (images.permute(0, 3, 1, 2), labels)
        targets = ds.gather_targets(idx)
        return batch if targets is None else (*batch, targets)


def _passthrough(item: Any) -> Any:
    return item


class _SeedWorker:
    """worker_init_fn: seed numpy and random from torch's per-worker seed (picklable for spawn)."""

    def __init__(self, user_fn: Callable[[int], None] | None) -> None:
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        seed = torch.initial_seed() % 2**32  # base seed (from the loader's generator) + id
        np.random.seed(seed)
        random.seed(seed)
        if self.user_fn is not None:
            self.user_fn(worker_id)


def build_dataloader(
    ds: Any,
    sampler: Sampler,
    *,
    collate: Callable[[list], Any] | None,
    num_workers: int,
    options: WorkerOptions,
    extra: dict[str, Any],
    pin_memory: bool,
    seed: int,
) -> DataLoader:
    """The DataLoader of workers mode; ``extra`` holds the remaining DataLoader arguments."""
    options.check_workers(num_workers)
    unknown = sorted(set(extra) - set(inspect.signature(DataLoader).parameters))
    if unknown:
        raise InvalidArgumentError(
            f"WorkerOptions dataloader_kwargs: {unknown[0]} is not an argument of this "
            f"torch's DataLoader ({torch.__version__})"
        )
    if num_workers > 0:
        extra["prefetch_factor"] = options.prefetch_factor or DEFAULT_PREFETCH_FACTOR
        extra["persistent_workers"] = options.persistent is not False
        extra["timeout"] = options.timeout
        if options.multiprocessing_context is not None:
            extra["multiprocessing_context"] = options.multiprocessing_context
    return DataLoader(
        _Batches(ds, collate),
        batch_size=None,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=_passthrough,
        pin_memory=pin_memory,
        worker_init_fn=_SeedWorker(options.worker_init_fn),
        generator=torch.Generator().manual_seed(seed % 2**63),
        **extra,
    )
