"""Many packs (shards) served as one dataset: ``PackedImageDataset([a.bin, b.bin])`` or a manifest.

``PackedImageDataset`` hands a list of packs, or a manifest written by ``pack-images
merge``, to ``MultiPackDataset``. Record ``i`` of the whole is found with one
``np.searchsorted`` in the shards' cumulative counts: no per-sample Python objects, so
forked workers stay flat however many records there are. A batch is split by shard
with one stable argsort, and each shard's part is copied straight from that shard's
mapping into its place in the output. Each shard is a ``PackMapping``: mapped lazily,
once per process, so the dataset pickles as its shards' small indexes.

Shards are checked at open (``imgpack.shards``): same format version, shape, classes
and packer settings, none twice, no slice of a sharded source missing unless allowed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from typing import Any, Callable

import numpy as np
import torch

from imgpack.classlist import check_same_classes
from imgpack.format.index import PackIndex, read_index
from imgpack.manifest import is_manifest, open_shards, read_manifest
from imgpack.reader.dataset import (
    PackedImageDataset,
    _batch_indices,
    _index,
)
from imgpack.reader.mapping import PackMapping, auto_prefault
from imgpack.shards import check_shards, combine_stats

__all__ = ["MultiPackDataset", "wants_multi"]

# Above this record size a batch spread over several shards is copied row by row into
# place; below it, each shard's rows are gathered with np.take and then scattered. On the
# shared 2-core dev machine (4 in-memory shards): 224x224 batch 64, rows 0.9 ms vs
# take+scatter 1.7 ms (one-shard np.take: 0.7 ms); 32x32 batch 256, rows 0.16 ms vs 0.10 ms.
_ROW_COPY_BYTES = 16 << 10


def wants_multi(source: Any) -> bool:
    """True when ``PackedImageDataset(source)`` means many packs: a list of them, or a manifest."""
    if isinstance(source, (str, bytes, os.PathLike)):
        return is_manifest(os.fsdecode(source))
    return isinstance(source, Iterable)


class MultiPackDataset(PackedImageDataset):
    """Samples of many packs as one map-style dataset, in the order the shards are given.

    ``source`` is a manifest path or a sequence of packs (.bin or .json). ``allow_partial``
    (lists only; a manifest records its own choice) accepts a sharded pack with shards
    missing. ``prefault=None`` decides once, for all shards together, from their total size.
    """

    def __init__(
        self,
        source: str | os.PathLike | Sequence[str | os.PathLike],
        transform: Callable[[torch.Tensor], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        *,
        advice: str | None = None,
        prefault: bool | None = None,
        allow_partial: bool = False,
        classes_from: Any = None,
    ):
        if isinstance(source, (str, bytes, os.PathLike)) and is_manifest(os.fsdecode(source)):
            manifest = read_manifest(os.fsdecode(source))
            indexes = open_shards(manifest)
            self._source: Any = str(manifest.path)
            self.warnings: list[str] = []
        else:
            packs = [source] if isinstance(source, (str, bytes, os.PathLike)) else list(source)
            paths = [os.fsdecode(p) for p in packs]
            indexes = [read_index(p) for p in paths]
            self.warnings = check_shards(indexes, paths, allow_partial=allow_partial)
            self._source = tuple(paths)
        if classes_from is not None:  # the shards agree on classes; check the first's
            check_same_classes(indexes[0].classes, classes_from, what=_name(self._source))
        if prefault is None:
            prefault = auto_prefault(sum(ix.sections["pixels"].nbytes for ix in indexes))
        self._packs = [PackMapping(ix, advice=advice, prefault=prefault) for ix in indexes]
        self._stats = combine_stats(indexes)
        self.transform, self.target_transform = transform, target_transform
        self._describe()

    def _describe(self) -> None:
        ref = self._packs[0].index
        counts = np.array([p.index.count for p in self._packs], dtype=np.int64)
        self._starts = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self._n = int(self._starts[-1])
        self.shard_sizes: tuple[int, ...] = tuple(int(c) for c in counts)
        self.classes: list[str] = list(ref.classes)
        self.class_to_idx: dict[str, int] = {c: i for i, c in enumerate(self.classes)}
        self._labels: np.ndarray | None = None
        self._targets: list[int] | None = None
        self._record_fields: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = {"packs": self._packs, "stats": self._stats, "source": self._source}
        return {**state, **self._transforms()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._packs, self._stats, self._source = state["packs"], state["stats"], state["source"]
        self._set_transforms(state)
        self.warnings = []
        self._describe()

    # -- what the shards say -------------------------------------------------------------

    @property
    def index(self) -> PackIndex:
        raise AttributeError(
            f"a dataset of {len(self._packs)} packs has one index per shard: see .indexes"
        )

    @property
    def indexes(self) -> list[PackIndex]:
        return [p.index for p in self._packs]

    @property
    def path(self) -> str:
        """The manifest, or the first pack of a list (``paths`` has them all)."""
        return self._source if isinstance(self._source, str) else self._source[0]

    @property
    def paths(self) -> list[str]:
        """Every shard's .bin, in dataset order."""
        return [str(p.index.data_path) for p in self._packs]

    @property
    def shape(self) -> tuple[int, int, int]:
        return self._packs[0].index.shape

    @property
    def channels(self) -> int:
        return self._packs[0].index.channels

    @property
    def pack_ids(self) -> tuple[str | None, ...]:
        """Every shard's pack id, in dataset order."""
        return tuple(p.index.pack_id for p in self._packs)

    @property
    def pack_id(self) -> str | None:
        """One identity for the shards in this order (None if any shard predates pack ids)."""
        ids = self.pack_ids
        if any(i is None for i in ids):
            return None
        return hashlib.sha256(",".join(ids).encode("ascii")).hexdigest()[:32]

    def _read_geometry(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = [p.index.geometry() for p in self._packs]
        out = tuple(np.concatenate([g[k] for g in parts]) for k in range(3))
        for a in out:
            a.flags.writeable = False
        return out

    def _read_target_vectors(self) -> np.ndarray | None:
        parts = [p.index.target_vectors() for p in self._packs]
        if parts[0] is None:
            return None  # check_shards: every shard has target vectors of one length, or none
        t = np.concatenate(parts)
        t.flags.writeable = False
        return t

    @property
    def mean(self) -> tuple[float, ...]:
        """Per-channel mean of all shards, from the exact sum of their integer sums."""
        return tuple(self._stats["mean"])

    @property
    def std(self) -> tuple[float, ...]:
        return tuple(self._stats["std"])

    def _read_labels(self) -> np.ndarray:
        """Every shard's labels, concatenated in dataset order."""
        return np.concatenate([p.index.read_section("labels") for p in self._packs])

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        h, w, _ = self.shape
        return (
            f"PackedImageDataset({self._source!r}, {len(self._packs)} shards, {len(self)} "
            f"records, {h}x{w}, {len(self.classes)} classes)"
        )

    def locate(self, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        """(shard, record in that shard) for global ``indices`` (negatives count from the end)."""
        idx = _batch_indices(indices, self._n)
        shard = np.searchsorted(self._starts, idx, side="right") - 1
        return shard, idx - self._starts[shard]

    # -- samples -------------------------------------------------------------------------

    def _record(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """Record ``j`` (in range): a copy-on-write view in its shard's mapping, and its label."""
        s = int(np.searchsorted(self._starts, j, side="right")) - 1
        k = j - int(self._starts[s])
        v = self._packs[s].views
        rec = v.pixels[k] if v.writable else v.pixels[k].copy()
        return rec, v.labels[k]

    def _groups(self, idx: np.ndarray) -> Iterable[tuple[int, np.ndarray, np.ndarray]]:
        """(shard, positions in the batch (ascending), records in the shard) per shard touched."""
        shard = np.searchsorted(self._starts, idx, side="right") - 1
        local = idx - self._starts[shard]
        if (shard == shard[0]).all():
            yield int(shard[0]), np.arange(len(idx)), local
            return
        order = np.argsort(shard, kind="stable")
        for pos in np.split(order, np.flatnonzero(np.diff(shard[order])) + 1):
            yield int(shard[pos[0]]), pos, local[pos]

    def _gather(self, idx: np.ndarray, out_images: np.ndarray, out_labels: np.ndarray) -> None:
        if len(idx) == 0:
            return
        rows = int(np.prod(self.shape)) >= _ROW_COPY_BYTES
        for s, pos, local in self._groups(idx):
            v = self._packs[s].views
            out_labels[pos] = v.labels[local]
            lo, hi = int(pos[0]), int(pos[-1]) + 1
            if hi - lo == len(pos):  # a run of the batch: the shard's own fast path, in place
                np.take(v.pixels, local, axis=0, out=out_images[lo:hi], mode="clip")
            elif rows:
                px = v.pixels
                for p, k in zip(pos.tolist(), local.tolist()):
                    out_images[p] = px[k]
            else:
                out_images[pos] = np.take(v.pixels, local, axis=0, mode="clip")

    @property
    def resident(self) -> bool:
        return all(p.warm for p in self._packs)

    def will_need(self, indices: Any) -> None:
        """Ask the kernel to start reading records ``indices`` (MADV_WILLNEED), shard by shard."""
        idx = _batch_indices(indices, self._n)
        if len(idx):
            for s, _, local in self._groups(idx):
                self._packs[s].will_need(local)

    def source_path(self, i: Any) -> str:
        """Record ``i``'s source file, relative to the folder that was packed."""
        j = _index(i, self._n)
        s = int(np.searchsorted(self._starts, j, side="right")) - 1
        return self._packs[s].source_path(j - int(self._starts[s]))

    def close(self) -> None:
        """Unmap every shard now (the next access maps again)."""
        for p in self._packs:
            p.close()


def _name(source: Any) -> str:
    """How messages name a multi-pack dataset: its manifest, or its first pack and a count."""
    if isinstance(source, str):
        return os.path.basename(source)
    more = f" (+{len(source) - 1} more)" if len(source) > 1 else ""
    return os.path.basename(source[0]) + more
