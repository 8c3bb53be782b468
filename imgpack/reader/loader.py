"""``make_loader``: the usual DataLoader template as one function, plus resumable epochs.

Two ways to deliver batches, chosen by ``mode``:

``"workers"``    a torch ``DataLoader`` whose batch sampler walks an ``EpochOrder``, with
                 ``collate_fn=collate_batch`` so each worker calls ``ds.__getitems__`` once per
                 batch and collation does no per-sample work.
``"inprocess"``  ``InProcessLoader``: no worker processes, one thread gathering into reusable
                 (pinned where CUDA exists) buffers. See ``imgpack.reader.inprocess``.
``"auto"``       ``choose_mode``: in-process unless something asks for a DataLoader.

Either way the sequence of batches depends only on the seed, the epoch and the rank, so the
two modes yield the same batches, and ``state_dict()`` taken at any point restores to the
next unseen batch. Epochs: each full pass advances the epoch by itself, so a loop that never
calls ``set_epoch`` still sees a new order every epoch; ``set_epoch(e)`` jumps to epoch ``e``
(and is a no-op for the epoch under way, so it does not undo a restore). A pass that stops
early (``break``) continues where it stopped on the next ``iter()``, exactly as a restore would.

In-process batches are views of reused buffers: a batch stays intact while the next one is
fetched and is overwritten after that (``for x, y in loader: model(x.to(device))`` is safe);
pass ``copy=True`` to keep batches longer.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from imgpack.errors import LoaderConfigError
from imgpack.machine import usable_cores
from imgpack.reader.dataset import collate_batch
from imgpack.reader.inprocess import DEFAULT_PREFETCH, InProcessLoader
from imgpack.reader.order import EpochOrder

__all__ = [
    "make_loader",
    "PackLoader",
    "OrderSampler",
    "choose_mode",
    "default_workers",
    "AUTO_MODE",
    "DEFAULT_WORKERS",
    "DEFAULT_PREFETCH_FACTOR",
    "DEFAULT_GATHER_THREADS",
]

# Defaults to be set from docs/benchmarks.md (scripts/bench_load.py). First small-scale
# measurement (shared 2-core machine, busy; 4000-image 224x224 pack, batch 256, warm cache,
# median of 3 epochs): in-process 35k images/s; DataLoader with 0 / 1 / 2 workers 11.6k /
# 8.7k / 13.6k; single-thread memcpy 71k. A packed batch needs no decoding, so worker
# processes only add a copy through shared memory; 2 workers beat 1 on 2 cores.
AUTO_MODE = "inprocess"  # what mode="auto" picks when nothing asks for a DataLoader
DEFAULT_WORKERS = 2  # workers mode: at most this many worker processes (fewer on fewer cores)
DEFAULT_PREFETCH_FACTOR = 4  # workers mode: batches in flight per worker
# in-process mode: threads gathering each batch. One thread copying random records into
# fresh buffers reached 46k images/s at 224x224 on the 2-core benchmark machine, two
# reached 82k (memcpy: 86k): a second thread is where the remaining bandwidth is.
DEFAULT_GATHER_THREADS = 2
MODES = ("auto", "workers", "inprocess")
_INPROCESS_KWARGS = {"timeout"}  # DataLoader arguments the in-process path understands
_OWN_KWARGS = {"batch_size", "shuffle", "sampler", "batch_sampler", "dataset"}
_warned_pin = False


def default_workers() -> int:
    """Worker processes for workers mode: DEFAULT_WORKERS, capped by the usable cores."""
    return max(1, min(DEFAULT_WORKERS, usable_cores()))


def choose_mode(dataset: Any, *, num_workers: int | None, dataloader_kwargs: dict) -> str:
    """Pick the delivery for ``mode="auto"``.

    A stored pack needs no decoding, so a gather in this process is cheaper than worker
    processes plus a copy through shared memory. Workers win only when there is per-sample
    work to spread over cores (a transform) or the caller asked for a DataLoader (an
    explicit ``num_workers`` or DataLoader-only arguments), or the dataset cannot gather.
    """
    wants_dataloader = set(dataloader_kwargs) - _INPROCESS_KWARGS
    if num_workers is not None or wants_dataloader:
        return "workers"
    if getattr(dataset, "transform", None) is not None or not hasattr(dataset, "gather"):
        return "workers"
    return AUTO_MODE


class OrderSampler(Sampler):
    """A batch sampler that yields one index array per batch of an ``EpochOrder`` pass."""

    def __init__(self, order: EpochOrder) -> None:
        self.order = order
        self.epoch, self.start = 0, 0

    def plan(self, epoch: int, start: int) -> None:
        """Set the epoch and first batch of the next ``iter()``."""
        self.epoch, self.start = epoch, start

    def __iter__(self) -> Iterator[np.ndarray]:
        return self.order.batches(self.epoch, self.start)

    def __len__(self) -> int:
        return len(self.order)


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


class PackLoader:
    """Iterable of (images uint8 (B,3,H,W), labels int64 (B,)) with epochs and resumable state."""

    def __init__(self, dataset: Any, order: EpochOrder, sampler: OrderSampler, source: Any):
        self.dataset, self.order, self.sampler = dataset, order, sampler
        self._source = source
        self.mode = "inprocess" if isinstance(source, InProcessLoader) else "workers"

    @property
    def dataloader(self) -> DataLoader | None:
        """The torch DataLoader in workers mode; None in in-process mode."""
        return self._source if self.mode == "workers" else None

    @property
    def epoch(self) -> int:
        return self.order.epoch

    @property
    def batch_size(self) -> int:
        return self.order.batch_size

    def __len__(self) -> int:
        """Batches in one epoch on this rank."""
        return len(self.order)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch, start = self.order.begin_pass()
        self.sampler.plan(epoch, start)
        it = iter(self._source)
        try:
            for batch in it:
                self.order.batches_done += 1  # counted as handed over, not as fetched
                yield batch
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def close(self) -> None:
        """Stop worker processes or the loader thread now rather than at garbage collection.

        torch has no public call that stops persistent workers; this does what the
        DataLoader iterator's own ``__del__`` does. Iterating again starts them afresh.
        """
        if isinstance(self._source, InProcessLoader):
            self._source.close()
            return
        it = getattr(self._source, "_iterator", None)
        shutdown = getattr(it, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
            self._source._iterator = None

    def __enter__(self) -> PackLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch (a no-op for the epoch under way)."""
        self.order.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Epoch, batches consumed and seed (plus the layout they are valid for)."""
        return self.order.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the next unseen batch of ``state``; refuses a state of another loader."""
        self.order.load_state_dict(state)


def _resolve_pin(pin_memory: bool | None) -> bool:
    global _warned_pin
    cuda = torch.cuda.is_available()
    if pin_memory is None:
        return cuda
    if pin_memory and not cuda:
        if not _warned_pin:
            warnings.warn("pin_memory=True ignored: no CUDA device", RuntimeWarning, stacklevel=3)
            _warned_pin = True
        return False
    return bool(pin_memory)


def _resolve_ranks(distributed: bool | None, rank: int | None, world: int | None):
    ready = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed is None:
        distributed = ready or rank is not None or world is not None
    if not distributed:
        if rank not in (None, 0) or world not in (None, 1):
            raise LoaderConfigError(f"distributed=False with rank={rank}, world_size={world}")
        return 0, 1
    if (rank is None or world is None) and not ready:
        raise LoaderConfigError(
            "distributed loading needs torch.distributed initialised, or rank and world_size"
        )
    rank = torch.distributed.get_rank() if rank is None else rank
    world = torch.distributed.get_world_size() if world is None else world
    return rank, world


def _record_bytes(dataset: Any) -> int | None:
    index = getattr(dataset, "index", None)
    if getattr(index, "record_bytes", None):
        return int(index.record_bytes)
    shape = getattr(dataset, "shape", None)
    return int(np.prod(shape)) if shape else None


def make_loader(
    ds: Any,
    batch_size: int,
    shuffle: bool = True,
    *,
    num_workers: int | None = None,
    prefetch_factor: int | None = None,
    persistent_workers: bool | None = None,
    pin_memory: bool | None = None,
    drop_last: bool = False,
    seed: int = 0,
    order: str = "uniform",
    mode: str = "auto",
    distributed: bool | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    prefetch_hints: bool | None = None,
    gather_threads: int | None = None,
    block: int | None = None,
    window: int | None = None,
    shard_local: bool = False,
    copy: bool = False,
    **dataloader_kwargs: Any,
) -> PackLoader:
    """A loader over ``ds`` with benchmark-backed defaults; see the module docstring.

    ``prefetch_factor`` is batches in flight per worker (workers mode) or batches gathered
    ahead (in-process). Distributed loading is on when torch.distributed is initialised
    (rank and world size come from it) or when ``rank``/``world_size`` are given.
    ``shard_local`` keeps each rank on its own shards (``ds.shard_sizes``; see ``order.py``).
    ``copy`` (in-process only) yields tensors you may keep instead of ring-buffer views.
    ``prefetch_hints`` (in-process only) announces the next batch with ``ds.will_need``;
    ``None`` does so only when the pack is not prefaulted whole (``ds.resident``): on a
    resident pack the hint is a wasted syscall per record. In workers mode other workers
    already fetch ahead. ``gather_threads`` (in-process only) splits each batch over that many
    threads; ``None`` means ``min(DEFAULT_GATHER_THREADS, cores)``. Any explicit
    ``num_workers``, even 0, asks for a torch DataLoader.
    """
    if mode not in MODES:
        raise LoaderConfigError(f"mode should be one of {', '.join(MODES)}, found {mode!r}")
    clash = sorted(set(dataloader_kwargs) & _OWN_KWARGS)
    if clash:
        raise LoaderConfigError(f"make_loader sets {', '.join(clash)} itself; do not pass them")
    if num_workers is not None and (
        isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0
    ):
        raise LoaderConfigError(f"num_workers should be an integer >= 0, found {num_workers!r}")
    if mode == "auto":
        mode = choose_mode(ds, num_workers=num_workers, dataloader_kwargs=dataloader_kwargs)
    rank, world_size = _resolve_ranks(distributed, rank, world_size)
    shard_sizes = None
    if shard_local:
        shard_sizes = getattr(ds, "shard_sizes", None) or [len(ds)]
    epoch_order = EpochOrder(
        len(ds),
        batch_size=batch_size,
        shuffle=shuffle,
        order=order,
        seed=seed,
        block=block,
        window=window,
        record_bytes=_record_bytes(ds),
        rank=rank,
        world_size=world_size,
        drop_last=drop_last,
        shard_sizes=shard_sizes,
    )
    sampler = OrderSampler(epoch_order)
    pin = _resolve_pin(pin_memory)
    if mode == "inprocess":
        extra = sorted(set(dataloader_kwargs) - _INPROCESS_KWARGS)
        if num_workers or persistent_workers or extra:
            asked = ", ".join(extra) or "worker processes"
            raise LoaderConfigError(f"mode='inprocess' runs no workers and takes no {asked}")
        source = InProcessLoader(
            ds,
            sampler,
            prefetch=DEFAULT_PREFETCH if prefetch_factor is None else prefetch_factor,
            pin_memory=pin,
            prefetch_hints=(
                not getattr(ds, "resident", False) if prefetch_hints is None else prefetch_hints
            ),
            threads=(
                max(1, min(DEFAULT_GATHER_THREADS, usable_cores()))
                if gather_threads is None
                else gather_threads
            ),
            copy=copy,
            timeout=dataloader_kwargs.get("timeout"),
        )
        return PackLoader(ds, epoch_order, sampler, source)
    workers = default_workers() if num_workers is None else num_workers
    if persistent_workers and workers == 0:
        raise LoaderConfigError("persistent_workers=True needs num_workers > 0")
    if workers == 0 and prefetch_factor is not None:
        raise LoaderConfigError("prefetch_factor needs num_workers > 0")
    if workers > 0:
        dataloader_kwargs.setdefault("prefetch_factor", prefetch_factor or DEFAULT_PREFETCH_FACTOR)
        dataloader_kwargs["persistent_workers"] = persistent_workers is not False
    if hasattr(ds, "__getitems__") and "collate_fn" not in dataloader_kwargs:
        dataloader_kwargs["collate_fn"] = collate_batch
    user_init = dataloader_kwargs.pop("worker_init_fn", None)
    dataloader_kwargs.setdefault("generator", torch.Generator().manual_seed(seed))
    source = DataLoader(
        ds,
        batch_sampler=sampler,
        num_workers=workers,
        pin_memory=pin,
        worker_init_fn=_SeedWorker(user_init),
        **dataloader_kwargs,
    )
    return PackLoader(ds, epoch_order, sampler, source)
