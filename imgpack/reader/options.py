"""The expert knobs of ``make_loader``, one small options object per concern, each
checking its own values when it is made (``make_loader`` checks the rest of its call).

The common call stays short (``make_loader(ds, 256)``); what only matters to one way of
delivering batches lives in that way's options object, so a knob cannot be passed where it
does nothing: ``make_loader`` refuses it with a message that says what would apply.

``InProcessOptions``   the default delivery: each batch is read in this process, in the loop's
                       thread or by a thread ahead of it.
``WorkerOptions``      a torch ``DataLoader`` with worker processes (``num_workers``).
``OrderOptions``       how records are ordered: ``uniform``, ``block`` (for packs larger
                       than RAM), ``sequential``; ``block``/``window`` sizes.
``DistributedOptions`` an explicit rank and world size (without ``torch.distributed``), and
                       shard-local reading.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from inspect import signature
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader

from imgpack.errors import InvalidArgumentError
from imgpack.reader.order import ORDERS, check_flag, int_at_least

__all__ = ["InProcessOptions", "WorkerOptions", "OrderOptions", "DistributedOptions"]

# The one table of torch DataLoader keywords: each one make_loader sets itself -> what does
# the same through make_loader. Passed to make_loader by name, a DataLoader keyword is refused
# with its answer here (any other: with _PASSED_ON, where WorkerOptions passes it on); in
# WorkerOptions(dataloader_kwargs=...), one of these is refused when the options are made,
# and so is a name that is not a DataLoader argument.
_WORKERS = "with num_workers=N"
_RECORDS = "make_loader's order=OrderOptions(...) and distributed=DistributedOptions(...)"
DATALOADER_KEYWORDS = {
    "dataset": "make_loader's first argument",
    **{k: f"make_loader's {k}" for k in ("batch_size", "shuffle", "drop_last", "num_workers")},
    "pin_memory": "make_loader's pin_memory",
    "sampler": _RECORDS,
    "batch_sampler": _RECORDS,
    "generator": "make_loader's seed=N, which draws the order",
    "in_order": "nothing: batches come in order, which resuming relies on",
    "persistent_workers": f"options=WorkerOptions(persistent=True) {_WORKERS}",
    "multiprocessing_context": f"options=WorkerOptions(multiprocessing_context=...) {_WORKERS}",
    "worker_init_fn": f"options=WorkerOptions(worker_init_fn=...) {_WORKERS}",
    "timeout": f"options=WorkerOptions(timeout=S) {_WORKERS}, or InProcessOptions(timeout=S)",
    "prefetch_factor": f"options=WorkerOptions(prefetch_factor=N) {_WORKERS}, "
    "or InProcessOptions(prefetch=N)",
}


def _check_timeout(owner: str, value: Any, forever: Any) -> None:
    """A wait's timeout: seconds > 0, or ``forever``, the value that means none (None for
    the in-process loader, 0 for torch's DataLoader); else one line."""
    seconds = isinstance(value, (int, float))
    if not (value is forever or seconds and (value > 0 or value == forever)):
        raise InvalidArgumentError(
            f"{owner} timeout should be seconds > 0, or {forever!r} (no timeout), found {value!r}"
        )


@dataclass(frozen=True)
class InProcessOptions:
    """The in-process loader: no worker processes; see ``imgpack.reader.run``.

    ``prefetch``: batches read ahead of the loop by a background thread; 0 reads each batch
    in the loop's own thread when it asks for it. None: 0 where the loop's consumer is this
    CPU and a batch is a copy (no CUDA, no decode), else 2 (``imgpack.reader.run``).
    ``gather_threads``: threads that share one batch's read (None: one for a copy read in
    the loop's thread, else every usable core for a decode, two for a copy).
    ``hints``: announce the next batch to the kernel (MADV_WILLNEED); None: only when the
    pack is not warmed whole. ``timeout``: seconds to wait for a batch before raising
    LoaderError (None: forever; it needs a background thread).
    """

    gather_threads: int | None = None
    prefetch: int | None = None
    hints: bool | None = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        int_at_least("InProcessOptions gather_threads", self.gather_threads, 1, none_ok=True)
        int_at_least("InProcessOptions prefetch", self.prefetch, 0, none_ok=True)
        check_flag("InProcessOptions hints", self.hints, none_ok=True)
        _check_timeout("InProcessOptions", self.timeout, None)
        if self.prefetch == 0 and self.timeout is not None:
            # a timeout waits for a background thread: none here
            raise InvalidArgumentError("InProcessOptions(timeout=...) needs prefetch > 0, not 0")


@dataclass(frozen=True)
class WorkerOptions:
    """A torch ``DataLoader`` with ``num_workers`` processes (make_loader's argument).

    ``prefetch_factor``: batches in flight per worker (None: 4). ``persistent``: keep the
    workers between epochs (None: yes). ``multiprocessing_context``, ``worker_init_fn`` and
    ``timeout`` go to the DataLoader as they are; ``dataloader_kwargs`` holds any other
    DataLoader argument (``collate_fn`` applies to per-sample work only), refused when it is
    one ``make_loader`` sets itself (``DATALOADER_KEYWORDS``) or not a DataLoader argument.
    """

    prefetch_factor: int | None = None
    persistent: bool | None = None
    multiprocessing_context: Any = None
    worker_init_fn: Callable[[int], None] | None = None
    timeout: float = 0
    dataloader_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        int_at_least("WorkerOptions prefetch_factor", self.prefetch_factor, 1, none_ok=True)
        check_flag("WorkerOptions persistent", self.persistent, none_ok=True)
        _check_timeout("WorkerOptions", self.timeout, 0)
        for k in sorted(self.dataloader_kwargs):
            if k in DATALOADER_KEYWORDS:
                raise InvalidArgumentError(
                    f"WorkerOptions dataloader_kwargs: {k} is set by {DATALOADER_KEYWORDS[k]}"
                )
            if k not in signature(DataLoader).parameters:
                raise InvalidArgumentError(
                    f"WorkerOptions dataloader_kwargs: {k} is not an argument of this torch's "
                    f"DataLoader ({torch.__version__})"
                )


@dataclass(frozen=True)
class OrderOptions:
    """Record order: ``order`` is one of uniform, block, sequential (see ``order.py``).

    ``block`` (records per contiguous block) and ``window`` (blocks shuffled together)
    apply to ``order="block"`` only; None: about 8 MB blocks and 256 MB windows.
    ``repeat``: one factor >= 0 per pack of the dataset; an epoch takes ``round(r * n)``
    of a pack's ``n`` records (``order.py``, Mixing).
    """

    order: str = "uniform"
    block: int | None = None
    window: int | None = None
    repeat: Sequence[float] | None = None

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise InvalidArgumentError(f"order should be one of {ORDERS}, found {self.order!r}")
        values = list(self.repeat) if isinstance(self.repeat, (list, tuple, np.ndarray)) else []
        kinds = (int, float, np.integer, np.floating)
        finite = all(
            isinstance(r, kinds) and not isinstance(r, bool) and 0 <= r < np.inf for r in values
        )
        if self.repeat is not None and not (values and finite):
            raise InvalidArgumentError(
                f"repeat should be a list of factors >= 0, one per pack, found {self.repeat!r}"
            )
        int_at_least("OrderOptions block", self.block, 1, none_ok=True)
        int_at_least("OrderOptions window", self.window, 1, none_ok=True)
        if self.order != "block" and (self.block is not None or self.window is not None):
            knob = "block" if self.block is not None else "window"
            raise InvalidArgumentError(
                f"OrderOptions({knob}=...) applies to order='block' only, not {self.order!r}"
            )


@dataclass(frozen=True)
class DistributedOptions:
    """Ranks without (or overriding) ``torch.distributed``, and shard-local reading.

    ``rank``/``world_size``: this process's place (None: from the process group).
    ``shard_local``: each rank reads mostly its own shards (the packs of ``ds.indexes``; order.py).
    """

    rank: int | None = None
    world_size: int | None = None
    shard_local: bool = False

    def __post_init__(self) -> None:
        int_at_least("DistributedOptions rank", self.rank, 0, none_ok=True)
        int_at_least("DistributedOptions world_size", self.world_size, 1, none_ok=True)
        if (self.rank is None) != (self.world_size is None):
            raise InvalidArgumentError("DistributedOptions needs both rank and world_size")
        if self.rank is not None and self.rank >= self.world_size:
            raise InvalidArgumentError(
                f"DistributedOptions rank should be in [0, {self.world_size}), found {self.rank}"
            )
