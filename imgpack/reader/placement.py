"""Where a loader stands: its rank and world size, its seed, whether batches are pinned, and
the records' mean stored size (what the block order counts in)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from imgpack.errors import InvalidArgumentError
from imgpack.format.layout import record_nbytes
from imgpack.reader.options import DistributedOptions
from imgpack.reader.protocol import PackedSource, decodes_jpeg

__all__ = ["record_bytes", "resolve_pin", "resolve_ranks", "resolve_seed", "warn_once"]

_warned: set[str] = set()  # warnings given once per process


def warn_once(key: str, message: str, *, depth: int = 1) -> None:
    """A RuntimeWarning once per process, pointing at the caller ``depth`` frames above
    the function that called this one (make_loader's caller, for make_loader)."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=2 + depth)


def resolve_pin(pin_memory: bool | None, delivery: Any) -> bool:
    cuda = torch.cuda.is_available()
    if pin_memory is None:  # pinned only where an async copy to a GPU will read it
        return cuda and (delivery.device is None or delivery.cuda)
    if pin_memory and not cuda:
        warn_once("pin", "pin_memory=True ignored: no CUDA device", depth=2)
        return False
    return bool(pin_memory)


def resolve_ranks(distributed: Any) -> tuple[int, int, bool]:
    """(rank, world size, shard_local) from ``distributed=`` and the process group."""
    ready = torch.distributed.is_available() and torch.distributed.is_initialized()
    opts = distributed if isinstance(distributed, DistributedOptions) else DistributedOptions()
    if distributed not in (None, True, False) and not isinstance(distributed, DistributedOptions):
        raise InvalidArgumentError(
            f"distributed should be None, True, False or DistributedOptions, found {distributed!r}"
        )
    if distributed is False:
        return 0, 1, False
    if opts.rank is not None:
        return opts.rank, opts.world_size, opts.shard_local
    if not ready:
        if distributed is not True:  # one process: shard-local reading changes nothing
            return 0, 1, opts.shard_local
        raise InvalidArgumentError(
            "distributed loading needs torch.distributed initialised, or "
            "DistributedOptions(rank=..., world_size=...)"
        )
    return torch.distributed.get_rank(), torch.distributed.get_world_size(), opts.shard_local


def resolve_seed(seed: int | None, world_size: int) -> int:
    """``seed``, or one drawn from torch's default generator (so torch.manual_seed governs it);
    under torch.distributed every rank takes rank 0's draw."""
    if seed is not None:
        return seed
    drawn = int(torch.empty((), dtype=torch.int64).random_().item())
    if world_size > 1:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise InvalidArgumentError(
                "shuffle=True across ranks without torch.distributed needs seed=..., so that "
                "every rank draws the same order"
            )
        box = [drawn]
        torch.distributed.broadcast_object_list(box, src=0)
        drawn = int(box[0])
    return drawn


def record_bytes(ds: PackedSource) -> int:
    """The records' mean stored size: what the block order's block size is counted in."""
    sizes = np.asarray(ds.record_sizes)
    if not len(sizes):
        return int(np.prod(ds.shape))
    if decodes_jpeg(ds):  # a JPEG record's size is its own
        return max(1, round(float(np.mean(ds.record_lengths))))
    nbytes = record_nbytes(ds.codec, sizes[:, 0], sizes[:, 1], ds.shape[2])
    return max(1, round(float(np.mean(nbytes))))
