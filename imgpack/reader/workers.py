"""Reads run by a torch ``DataLoader``: in worker processes, or per sample.

``Workers``  the read stage in ``num_workers`` processes: the plan is the DataLoader's
             sampler (``batch_size=None``), so a worker's fetch is one whole ``Batch``
             request, read by the read stage the loader chose, and comes back as a
             ``Batch`` (its tensors in shared memory; pinned by the DataLoader's own
             thread, through ``Batch.pin_memory``). The default collate never sees it.
``Samples``  a dataset served sample by sample (one with a per-sample ``transform``, or
             anyone's map-style dataset): torch's own DataLoader fetches each batch's
             samples, as it does for any dataset (``__getitems__`` where it has one), and
             collates them; ``num_workers=0`` fetches in the calling thread. Its batches
             come back in the plan's order, so each is paired with the records it holds.

Either way the DataLoader is made once and kept (its persistent workers with it);
``close`` drops it, which is how torch stops persistent workers (the iterator's
finaliser), and the next pass makes a new one. Persistent workers serve one pass at a
time: an older pass's iterator still held raises ``LoaderError`` rather than take the new
pass's batches (without persistent workers, passes run side by side, as a DataLoader's do).
A worker's error ends the pass and the workers; an imgpack error comes back as the one
line it was raised with.
"""

from __future__ import annotations

import collections
import inspect
import random
import threading
import traceback
from collections.abc import Iterable, Iterator
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader

from imgpack.errors import ImgpackError, InvalidArgumentError, LoaderError
from imgpack.machine import usable_cores
from imgpack.reader.batch import Batch
from imgpack.reader.inprocess import CLOSED
from imgpack.reader.options import WorkerOptions
from imgpack.reader.plan import Plan

__all__ = [
    "Workers",
    "Samples",
    "loader_arguments",
    "default_workers",
    "DEFAULT_WORKERS",
    "DEFAULT_PREFETCH_FACTOR",
]

DEFAULT_WORKERS = 2  # at most this many worker processes (fewer on fewer cores)
DEFAULT_PREFETCH_FACTOR = 4  # batches in flight per worker
_WORKER_ONLY = ("prefetch_factor", "persistent", "multiprocessing_context", "timeout")


def default_workers() -> int:
    """Worker processes for workers mode: DEFAULT_WORKERS, capped by the usable cores."""
    return max(1, min(DEFAULT_WORKERS, usable_cores()))


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


def _passthrough(item: Any) -> Any:
    return item


def loader_arguments(
    num_workers: int, options: WorkerOptions, extra: dict[str, Any], pin: bool, seed: int
) -> dict[str, Any]:
    """The DataLoader's arguments besides the dataset and the sampling (what ``Workers`` and
    ``Samples`` take); ``extra`` holds what ``WorkerOptions.dataloader_kwargs`` adds."""
    # what needs worker processes, refused without them (left at its default: not asked)
    name = next((k for k in _WORKER_ONLY if getattr(options, k) not in (None, False, 0)), None)
    if num_workers == 0 and name is not None:
        raise InvalidArgumentError(
            f"WorkerOptions({name}=...) needs num_workers > 0; with num_workers=0 "
            "batches are made in the loop's own process"
        )
    unknown = sorted(set(extra) - set(inspect.signature(DataLoader).parameters))
    if unknown:
        raise InvalidArgumentError(
            f"WorkerOptions dataloader_kwargs: {unknown[0]} is not an argument of this "
            f"torch's DataLoader ({torch.__version__})"
        )
    kw = dict(extra)
    if num_workers > 0:
        kw["prefetch_factor"] = options.prefetch_factor or DEFAULT_PREFETCH_FACTOR
        kw["persistent_workers"] = options.persistent is not False
        kw["timeout"] = options.timeout
        if options.multiprocessing_context is not None:
            kw["multiprocessing_context"] = options.multiprocessing_context
    kw.update(
        num_workers=num_workers,
        pin_memory=pin,
        worker_init_fn=_SeedWorker(options.worker_init_fn),
        generator=torch.Generator().manual_seed(seed % 2**63),
    )
    return kw


class _ReadEach:
    """What the DataLoader's workers see: ``self[request]`` is the read ``Batch``."""

    def __init__(self, read: Callable[[Batch, Any], Batch], n: int) -> None:
        self.read, self.n = read, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, request: Batch) -> Batch:
        return self.read(request, None)


def _one_line(exc: ImgpackError) -> ImgpackError:
    """An imgpack error torch re-raised from a worker ("Caught X in DataLoader worker process
    N. Original Traceback ...") as the line it was raised with."""
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    prefix = f"{type(exc).__name__}: "  # the traceback's last line: [module.]Name: message
    last = lines[-1] if lines else ""
    if len(lines) < 2 or prefix not in last:
        return exc
    clean = type(exc)(last.split(prefix, 1)[1])
    if hasattr(clean, "add_note"):  # Python 3.11 on
        clean.add_note(f"raised in a DataLoader worker process ({lines[0].rstrip('.')})")
    return clean


class _Kept:
    """A DataLoader made on first use and dropped by ``close``, serving one pass at a time."""

    def __init__(self, make: Callable[[], DataLoader]) -> None:
        self._make, self._loader = make, None
        self._passes = self._closes = 0

    @property
    def dataloader(self) -> DataLoader:
        if self._loader is None:
            self._loader = self._make()
        return self._loader

    def close(self) -> None:
        """Drop the DataLoader: torch shuts its persistent workers down with it."""
        self._closes += 1  # a pass under way ends at its next batch
        self._loader = None

    def _pass(self) -> Iterator[Any]:
        """The DataLoader's items for one pass, which ends (LoaderError) when the loader is
        closed, or when a newer pass begins on persistent workers (torch then resets the one
        iterator they serve, and the older pass would take the newer one's batches); an
        error ends the workers too."""
        self._passes += 1
        mine, closes, dl = self._passes, self._closes, self.dataloader
        shared = dl.persistent_workers and dl.num_workers > 0
        items = iter(dl)
        del dl
        while True:
            if self._closes != closes or (shared and self._passes != mine):
                raise LoaderError(CLOSED)
            try:
                item = next(items)
            except BaseException as exc:
                # torch's frames in the traceback refer to its iterator: cleared, and the
                # iterator let go, the workers are shut down now, by refcount, while their
                # queues still work (left to the garbage collector, the queues are closed
                # before the iterator asks the workers to stop, and it waits 5 s for each)
                traceback.clear_frames(exc.__traceback__)
                items = None
                ended = isinstance(exc, StopIteration)  # a worker's ends the pass, as in torch
                if not ended or "in DataLoader worker process" in str(exc):
                    self.close()
                if ended:
                    return
                if isinstance(exc, ImgpackError):
                    raise _one_line(exc) from None
                raise
            yield item
            item = None


class Workers(_Kept):
    """The read stage in worker processes (module docstring); ``plan`` is the sampler."""

    def __init__(
        self, read: Callable[[Batch, Any], Batch], plan: Plan, n: int, kw: dict[str, Any]
    ) -> None:
        super().__init__(
            lambda: DataLoader(
                _ReadEach(read, n), batch_size=None, sampler=plan, collate_fn=_passthrough, **kw
            )
        )

    def batches(self, plan: Iterable[Batch]) -> Iterator[Batch]:
        """One pass of the plan this source was made with."""
        return self._pass()


class _Indices:
    """The plan's records as lists of ints (a DataLoader's batch sampler), each kept in
    ``pending`` until the batch it names comes back."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.pending: collections.deque = collections.deque()

    def __len__(self) -> int:
        return len(self.plan)

    def __iter__(self) -> Iterator[list[int]]:
        for request in self.plan:
            self.pending.append(request)
            yield request.records.tolist()


def _as_batch(request: Batch, collated: Any) -> Batch:
    """A collated batch: (images, labels, ...) as the images and what follows them."""
    if isinstance(collated, (tuple, list)) and collated:
        return request.filled(collated[0], tuple(collated[1:]))
    return request.filled(collated, None)


class Samples(_Kept):
    """Batches built sample by sample by torch's DataLoader (module docstring)."""

    def __init__(
        self, ds: Any, plan: Plan, collate: Callable[[list], Any], kw: dict[str, Any]
    ) -> None:
        self.indices = indices = _Indices(plan)
        # the maker must not refer to self: a cycle would leave the DataLoader's workers to
        # the garbage collector, which shuts them down slowly (see ``_Kept._pass``)
        super().__init__(lambda: DataLoader(ds, batch_sampler=indices, collate_fn=collate, **kw))

    def batches(self, plan: Iterable[Batch]) -> Iterator[Batch]:
        return self(plan, None)

    def __call__(self, plan: Iterable[Batch], stop: threading.Event | None) -> Iterator[Batch]:
        """One pass (``plan`` is the one this source was made with)."""
        pending = self.indices.pending
        pending.clear()
        for collated in self._pass():
            yield _as_batch(pending.popleft(), collated)
