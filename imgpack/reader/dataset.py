"""``PackedImageDataset``: a map-style torch Dataset served zero-copy from a pack's mmap.

It keeps torch's Dataset contract exactly, so a plain ``DataLoader`` with the default
collate works: ``ds[i]`` is one sample ``(uint8 (C, H, W) tensor, int label)`` (plus a
float32 target vector when the pack has them) and ``ds.__getitems__(indices)`` a list of
such samples. ImageFolder's names mean what they mean there: ``transform`` and
``target_transform`` run on each sample, ``classes``, ``class_to_idx``, ``targets`` (a
list of ints), ``samples``/``imgs`` ((source path, label) pairs, built lazily).

The fast path is ``ds.gather(indices)``: a whole batch in one ``np.take``, uint8
(B, C, H, W) in channels_last memory (records are stored HWC, so no transpose is paid).
``make_loader`` calls it; the default collate never sees it.

The index is validated once, at construction, so a damaged pack fails at open. The .bin
is mapped lazily, once per process (``mapping.PackMapping``); the dataset pickles as its
small index only, so it works in DataLoader workers under fork and spawn. Nothing here
holds per-sample Python objects: every per-record column is a numpy view of the mapping.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from imgpack.classlist import check_same_classes
from imgpack.format.index import PackIndex, read_index
from imgpack.reader.indices import _batch_indices, _check_out, _empty_uint8, _index
from imgpack.reader.mapping import PackMapping

__all__ = ["PackedImageDataset", "SourceSamples"]


class PackedImageDataset(Dataset):
    """Samples of one pack: ``ds[i]`` is (uint8 tensor (C, H, W), int label[, target vector]).

    ``path`` names the .bin or the .json. ``transform`` (on the uint8 image tensor) and
    ``target_transform`` (on the int label) run per sample, as in ImageFolder.
    ``advice`` ("random", "sequential", "normal") is passed to madvise on the pixels;
    ``prefault`` warms the page cache with the whole pack in the background, once per node
    (see ``imgpack.reader.warm``); ``None`` means: only on Linux, and only when the pixels
    take less than half of MemAvailable. Hints are skipped where the platform lacks them.
    ``classes_from`` (another pack, a manifest, a class-list file, a dataset or a list of
    names) raises ``ClassMismatchError`` unless this pack has exactly those classes, in order.

    A list of packs, or a manifest written by ``pack-images merge``, gives one dataset
    over all of them (a ``MultiPackDataset``: see ``imgpack.reader.multi``).
    """

    def __new__(cls, path: Any = None, *args: Any, **kwargs: Any) -> PackedImageDataset:
        if cls is PackedImageDataset and path is not None:
            from imgpack.reader import multi  # imports this module: loaded only when needed

            if multi.wants_multi(path):
                return super().__new__(multi.MultiPackDataset)
        return super().__new__(cls)

    def __init__(
        self,
        path: str | os.PathLike,
        transform: Callable[[torch.Tensor], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        *,
        advice: str | None = None,
        prefault: bool | None = None,
        classes_from: Any = None,
    ):
        index = read_index(path)
        if classes_from is not None:  # a pack, manifest, class-list file, dataset or names
            check_same_classes(index.classes, classes_from, what=index.data_path.name)
        self._pack = PackMapping(index, advice=advice, prefault=prefault)
        self.transform, self.target_transform = transform, target_transform
        self._describe()

    def _describe(self) -> None:
        ix = self._pack.index
        self.classes: list[str] = list(ix.classes)
        self.class_to_idx: dict[str, int] = {c: i for i, c in enumerate(self.classes)}
        self._labels: np.ndarray | None = None
        self._targets: list[int] | None = None
        self._record_fields: dict[str, Any] = {}

    # -- pickling: only what reopens the pack; the mapping is made again lazily ------

    def __getstate__(self) -> dict[str, Any]:
        return {"pack": self._pack, **self._transforms()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._pack = state["pack"]
        self._set_transforms(state)
        self._describe()

    def _transforms(self) -> dict[str, Any]:
        return {"transform": self.transform, "target_transform": self.target_transform}

    def _set_transforms(self, state: dict[str, Any]) -> None:
        self.transform = state.get("transform")
        self.target_transform = state.get("target_transform")

    # -- what the index says ---------------------------------------------------------

    @property
    def index(self) -> PackIndex:
        return self._pack.index

    @property
    def path(self) -> str:
        return str(self._pack.index.data_path)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(H, W, C): records as stored."""
        return self._pack.index.shape

    @property
    def channels(self) -> int:
        """1 (grayscale) or 3 (RGB): images are uint8 (C, H, W)."""
        return self._pack.index.channels

    @property
    def pack_id(self) -> str | None:
        """The pack's identity (32 hex digits); None for packs older than format version 2."""
        return self._pack.index.pack_id

    # Per-record arrays (format version 2 record fields), read once on first use, read-only.

    @property
    def source_sizes(self) -> np.ndarray:
        """int64 (N, 2): (width, height) of each record's source image after EXIF rotation."""
        return self._cached("geometry", self._read_geometry)[0]

    @property
    def source_boxes(self) -> np.ndarray:
        """float32 (N, 4): (left, top, right, bottom) in source pixels that each record shows."""
        return self._cached("geometry", self._read_geometry)[1]

    @property
    def content_boxes(self) -> np.ndarray:
        """float32 (N, 4): (left, top, right, bottom) in record pixels where that part lies."""
        return self._cached("geometry", self._read_geometry)[2]

    @property
    def target_vectors(self) -> np.ndarray | None:
        """float32 (N, K): each record's target vector; None when the pack has none."""
        return self._cached("targets", self._read_target_vectors)

    def _cached(self, key: str, read: Any) -> Any:
        if key not in self._record_fields:
            self._record_fields[key] = read()
        return self._record_fields[key]

    def _read_geometry(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._pack.index.geometry()

    def _read_target_vectors(self) -> np.ndarray | None:
        return self._pack.index.target_vectors()

    @property
    def mean(self) -> tuple[float, ...]:
        """Per-channel mean on the 0..1 scale, computed exactly by the packer."""
        return tuple(self._pack.index.mean)

    @property
    def std(self) -> tuple[float, ...]:
        return tuple(self._pack.index.std)

    @property
    def resident(self) -> bool:
        """True once the whole pack is known to be in the page cache: read-ahead hints are
        then moot (see ``imgpack.reader.warm``)."""
        return self._pack.warm

    def _read_labels(self) -> np.ndarray:
        return self._pack.index.read_section("labels")

    @property
    def labels(self) -> np.ndarray:
        """Every label as one read-only int64 array (read from the file, not the mapping)."""
        if self._labels is None:
            t = np.asarray(self._read_labels()).astype(np.int64)
            t.flags.writeable = False
            self._labels = t
        return self._labels

    @property
    def targets(self) -> list[int]:
        """Every label as a list of ints, as ImageFolder has it (``labels`` is the numpy form).

        Built on first use, from one shared int object per class, so it costs one
        pointer per record; it is not pickled to workers.
        """
        if self._targets is None:
            lab = self.labels
            lo = int(lab.min()) if lab.size else 0
            hi = int(lab.max()) if lab.size else 0
            pool = np.array(list(range(lo, hi + 1)), dtype=object)
            self._targets = pool[lab - lo].tolist()
        return self._targets

    @property
    def samples(self) -> SourceSamples:
        """(source path, label) per record, read on access (ImageFolder's ``samples``)."""
        return SourceSamples(self)

    imgs = samples  # ImageFolder's older name for the same list

    def __len__(self) -> int:
        return self._pack.index.count

    def __repr__(self) -> str:
        h, w, _ = self.shape
        return (
            f"PackedImageDataset({self.path!r}, {len(self)} records, {h}x{w}, "
            f"{len(self.classes)} classes)"
        )

    # -- samples: torch's Dataset contract -------------------------------------------

    def _record(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """(H, W, C) view of record ``j`` (in range) and its label, both in the mapping."""
        v = self._pack.views
        rec = v.pixels[j] if v.writable else v.pixels[j].copy()
        return rec, v.labels[j]

    def _sample(self, j: int) -> tuple[Any, ...]:
        rec, label = self._record(j)
        # a permuted view of the mapped record (copy-on-write: writing to it changes only
        # this process's copy of the page, never the file)
        image: Any = torch.from_numpy(rec).permute(2, 0, 1)
        target: Any = int(label)
        if self.transform is not None:
            # its own copy, as ImageFolder gives: an in-place transform (a cutout) on the
            # view would change this record for every later read in this process
            image = self.transform(image.clone())
        if self.target_transform is not None:
            target = self.target_transform(target)
        vectors = getattr(self, "target_vectors", None)
        if vectors is None:
            return image, target
        return image, target, torch.from_numpy(np.array(vectors[j], dtype=np.float32))

    def __getitem__(self, i: Any) -> tuple[Any, ...]:
        """One sample: (uint8 (C, H, W) view of the record, int label[, float32 (K,)])."""
        return self._sample(_index(i, len(self)))

    def __getitems__(self, indices: Any) -> list[tuple[Any, ...]]:
        """A list of samples, as torch's fetcher hands to ``collate_fn`` (one bounds check)."""
        return [self._sample(j) for j in _batch_indices(indices, len(self)).tolist()]

    def gather(self, indices: Any) -> tuple[torch.Tensor, ...]:
        """A whole batch in one copy: uint8 (B, C, H, W) channels_last, int64 (B,)[, targets].

        Raw records: the per-sample ``transform`` is not applied (``make_loader`` takes a
        batched one). In a DataLoader worker the images live in shared memory from the start.
        """
        idx = _batch_indices(indices, len(self))
        images = _empty_uint8((len(idx), *self.shape))
        labels = torch.empty(len(idx), dtype=torch.int64)
        self._gather(idx, images.numpy(), labels.numpy())
        batch: tuple[torch.Tensor, ...] = (images.permute(0, 3, 1, 2), labels)
        targets = self.gather_targets(idx)
        return batch if targets is None else (*batch, targets)

    def gather_targets(self, indices: Any) -> torch.Tensor | None:
        """float32 (B, K) target vectors of ``indices``, or None when the pack has none."""
        vectors = getattr(self, "target_vectors", None)
        if vectors is None:
            return None
        idx = _batch_indices(indices, len(self))
        return torch.from_numpy(np.ascontiguousarray(vectors[idx], dtype=np.float32))

    def gather_into(
        self, indices: Any, out_images: np.ndarray, out_labels: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Copy records ``indices`` into caller-owned (B, H, W, C) uint8 and (B,) int64 arrays.

        They must have exactly the batch's shape (slice a larger buffer for a short batch).
        """
        idx = _batch_indices(indices, len(self))
        _check_out(out_images, (len(idx), *self.shape), np.uint8, "out_images")
        _check_out(out_labels, (len(idx),), np.int64, "out_labels")
        self._gather(idx, out_images, out_labels)
        return out_images, out_labels

    def _gather(self, idx: np.ndarray, out_images: np.ndarray, out_labels: np.ndarray) -> None:
        # Indices are already in range. mode="clip" lets numpy write straight into
        # ``out`` (mode="raise" buffers the whole result first: measured ~3.4x slower
        # at 224x224, batch 256); a sorted-order slice-copy loop measured no faster.
        v = self._pack.views
        np.take(v.pixels, idx, axis=0, out=out_images, mode="clip")
        out_labels[...] = v.labels[idx]

    def will_need(self, indices: Any) -> None:
        """Ask the kernel to start reading records ``indices`` (MADV_WILLNEED), if supported."""
        self._pack.will_need(_batch_indices(indices, self._pack.index.count))

    def source_path(self, i: Any) -> str:
        """Record ``i``'s source file, relative to the folder that was packed."""
        return self._pack.source_path(_index(i, self._pack.index.count))

    # -- cleanup -------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap now (the next access maps again). Tensors still viewing records keep them alive."""
        self._pack.close()

    def __enter__(self) -> PackedImageDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SourceSamples(Sequence):
    """``ds.samples``: (source path, label) pairs, each read from the pack when asked for."""

    def __init__(self, ds: PackedImageDataset) -> None:
        self._ds = ds

    def __len__(self) -> int:
        return len(self._ds)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        j = _index(i, len(self))
        return self._ds.source_path(j), int(self._ds.labels[j])  # no pixel record is read

    def __repr__(self) -> str:
        return f"<{len(self)} (source path, label) pairs of {self._ds.path}>"
