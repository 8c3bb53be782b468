"""Index checks and batch buffers of the dataset, and the loaders' per-sample fetch."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils.fetch import _MapDatasetFetcher

from imgpack.errors import InvalidArgumentError

__all__: list[str] = []  # private helpers of the datasets and of the loaders' per-sample path


def _index(i: Any, n: int) -> int:
    """One sample index: any integer (numpy, 0-d tensor), negative counts from the end."""
    try:
        j = operator.index(i)
    except TypeError:
        raise TypeError(f"dataset indices must be integers, not {type(i).__name__}") from None
    if j < 0:
        j += n
    if not 0 <= j < n:
        raise IndexError(f"index {i} is out of range for a pack of {n} records")
    return j


def _batch_indices(indices: Any, n: int) -> np.ndarray:
    """A 1-D intp array of in-range indices (negatives wrapped), or IndexError."""
    idx = np.asarray(indices)
    if idx.size == 0:
        return np.empty(0, dtype=np.intp)
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        raise TypeError(
            f"batch indices must be a 1-D sequence of integers, got {idx.dtype} {idx.shape}"
        )
    idx = idx.astype(np.intp, copy=False)
    lo, hi = int(idx.min()), int(idx.max())
    if lo < -n or hi >= n:
        bad = lo if lo < -n else hi
        raise IndexError(f"index {bad} is out of range for a pack of {n} records")
    if lo < 0:
        idx = np.where(idx < 0, idx + n, idx)
    return idx


def _check_out(arr: Any, shape: tuple[int, ...], dtype: type, what: str) -> np.ndarray:
    if (
        not isinstance(arr, np.ndarray)
        or arr.shape != shape
        or arr.dtype != dtype
        or not arr.flags.c_contiguous
        or not arr.flags.writeable
    ):
        if isinstance(arr, np.ndarray):
            why = [w for w, bad in (("not C-contiguous", not arr.flags.c_contiguous),
                                    ("read-only", not arr.flags.writeable)) if bad]  # fmt: skip
            found = " ".join([f"{arr.dtype} {arr.shape}", *why])
        else:
            found = f"a {type(arr).__module__}.{type(arr).__name__}, not a numpy array"
        raise InvalidArgumentError(
            f"{what} should be a writable C-contiguous {np.dtype(dtype)} array {shape}, "
            f"found {found}"
        )
    return arr


def _empty_uint8(shape: tuple[int, ...]) -> torch.Tensor:
    """A new uint8 tensor; in a DataLoader worker it lives in shared memory from the start.

    That is what torch's default collate does too: the batch then crosses to the
    main process without the extra copy ``share_memory_()`` would make.
    """
    numel = int(np.prod(shape))
    if numel and get_worker_info() is not None:
        new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
        if new_shared is not None:
            return torch.empty(0, dtype=torch.uint8).set_(new_shared(numel)).view(shape)
    return torch.empty(shape, dtype=torch.uint8)


def _as_fetched(samples: list[Any]) -> list[Any]:
    return samples


def _samples(dataset: Any, idx: np.ndarray) -> list[Any]:
    """The samples at ``idx``, fetched by torch's own map-style fetcher, as its DataLoader
    fetches them: ``__getitems__`` (with a list of ints) where the dataset has one, else one
    ``dataset[i]`` per index. What a foreign dataset offers is torch's question, not ours."""
    return _MapDatasetFetcher(dataset, True, _as_fetched, False).fetch(np.asarray(idx).tolist())
