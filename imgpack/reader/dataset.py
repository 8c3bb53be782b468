"""``PackedImageDataset``: a map-style torch Dataset served zero-copy from mapped packs.

It keeps torch's Dataset contract exactly, so a plain ``DataLoader`` with the default
collate works (on packs whose records share one size): ``ds[i]`` is one sample ``(uint8
RGB (C, h_i, w_i) tensor, int label)`` at the record's own size (plus a float32 target
vector when the packs have them) and ``ds.__getitems__(indices)`` a list of such samples.
ImageFolder's names mean what they mean there. The fast path is ``ds.gather(indices)``:
a whole batch as one canvas, uint8 in channels_last memory (records are stored HWC, so
no transpose is paid): one ``np.take`` per pack where every record fills the bound as raw
pixels, else record by record into a canvas padded with zeros (``imgpack.reader.canvas``;
a yuv420 pack's batch stays yuv420 until the loader's delivery). ``make_loader`` calls
it, the default collate never sees it.

Many packs (a list, or a manifest written by ``pack-images merge``) are one dataset, their
records in order; one pack is the case of one. Each per-record feature is written once, in
terms of (pack, record in the pack), in ``imgpack.reader.packs``. Indexes are validated
at construction, so a damaged pack fails at open; each .bin is mapped lazily, once per
process (``mapping.PackMapping``), and the dataset pickles as its small indexes only, so
it works in DataLoader workers under fork and spawn.
"""

from __future__ import annotations

import hashlib
import operator
import os
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from imgpack.classlist import check_same_classes
from imgpack.errors import InvalidArgumentError
from imgpack.format.index import PackIndex
from imgpack.reader import packs
from imgpack.reader.batch import Batch
from imgpack.reader.canvas import copy_canvas, crop_canvas, decode_canvas, slot_shape
from imgpack.reader.jpeg import check_scales
from imgpack.reader.mapping import PackMapping, auto_prefault
from imgpack.reader.read import Gather, Pixels, Setup, SharedMemory
from imgpack.reader.threads import POOL, check_threads
from imgpack.shards import combine_stats

__all__ = ["PackedImageDataset", "SourceSamples", "index", "batch_indices", "check_out"]


def index(i: Any, n: int) -> int:
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


def batch_indices(indices: Any, n: int) -> np.ndarray:
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


def check_out(
    arr: Any, shape: tuple[int, ...], dtype: type, what: str, contiguous: bool = True
) -> np.ndarray:
    """``arr`` if it is a writable ``dtype`` array of ``shape`` (C-contiguous unless
    ``contiguous`` is False), else one line."""
    packed = arr.flags.c_contiguous or not contiguous if isinstance(arr, np.ndarray) else False
    if (
        isinstance(arr, np.ndarray)
        and arr.shape == shape
        and arr.dtype == dtype
        and packed
        and arr.flags.writeable
    ):
        return arr
    kind = "C-contiguous " if contiguous else ""
    if isinstance(arr, np.ndarray):
        why = [w for w, bad in (("not C-contiguous", not packed),
                                ("read-only", not arr.flags.writeable)) if bad]  # fmt: skip
        found = " ".join([f"{arr.dtype} {arr.shape}", *why])
    else:
        found = f"a {type(arr).__module__}.{type(arr).__name__}, not a numpy array"
    raise InvalidArgumentError(
        f"{what} should be a writable {kind}{np.dtype(dtype)} array {shape}, found {found}"
    )


class SourceSamples(Sequence):
    """``ds.samples``: (source path, label) pairs, each path read from its pack when asked for."""

    def __init__(
        self, mapped: Sequence[PackMapping], starts: np.ndarray, labels: np.ndarray, name: str
    ) -> None:
        self._packs, self._starts, self._labels, self._name = mapped, starts, labels, name

    def __len__(self) -> int:
        return len(self._labels)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        j = index(i, len(self))
        return packs.source_path(self._packs, self._starts, j), int(self._labels[j])

    def __repr__(self) -> str:
        return f"<{len(self)} (source path, label) pairs of {self._name}>"


class PackedImageDataset(Dataset):
    """Samples of one pack or many: ``ds[i]`` is (uint8 RGB (C, h, w), int label[, targets]).

    ``path`` names a pack (its .bin or .json), a manifest written by ``pack-images merge``,
    or a sequence of packs, read as one dataset in the order given; packs of a sequence
    must agree (``FormatError`` names the one that does not), and ``allow_partial``
    accepts a sharded source with shards missing (a manifest records its own choice).
    ``transform`` (on the uint8 image tensor) and ``target_transform`` (on the int label)
    run per sample, as in ImageFolder. ``advice`` ("random", "sequential", "normal") is
    passed to madvise on the pixels; ``prefault`` warms the page cache with every pack in
    the background, once per node (see ``imgpack.reader.warm``); ``None`` means: only on
    Linux, and only when the pixels of all packs take less than half of MemAvailable.
    ``classes_from`` (another pack, a manifest, a class-list file, a dataset or a list of
    names) raises ``ClassMismatchError`` unless these packs have exactly those classes.
    """

    def __init__(
        self,
        path: str | os.PathLike | Sequence[str | os.PathLike],
        transform: Callable[[torch.Tensor], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        *,
        advice: str | None = None,
        prefault: bool | None = None,
        allow_partial: bool = False,
        classes_from: Any = None,
    ):
        indexes, self._manifest, self.warnings = packs.open_packs(path, allow_partial=allow_partial)
        if classes_from is not None:  # the packs agree on classes: check the first's
            check_same_classes(indexes[0].classes, classes_from, what=self._name(indexes))
        if prefault is None:  # decided once, for all packs together
            prefault = auto_prefault(sum(ix.sections["pixels"].nbytes for ix in indexes))
        self._packs = [PackMapping(ix, advice=advice, prefault=prefault) for ix in indexes]
        self.transform, self.target_transform = transform, target_transform
        self._describe()

    def _describe(self) -> None:
        """What follows from the packs (again after unpickling): offsets, classes, stats."""
        ref = self._packs[0].index
        self._starts = packs.starts_of(self._packs)
        self._n = int(self._starts[-1])
        self.classes: list[str] = list(ref.classes)
        self.class_to_idx: dict[str, int] = {c: i for i, c in enumerate(self.classes)}
        if len(self._packs) == 1:  # the packer's own numbers
            self._mean, self._std = tuple(ref.mean), tuple(ref.std)
        else:  # exact: from the sum of every pack's integer sums
            stats = combine_stats(self.indexes)
            self._mean, self._std = tuple(stats["mean"]), tuple(stats["std"])
        self._columns = packs.Columns(self._packs)
        # every record fills the bound as raw HWC: a batch is one np.take per pack
        self._uniform = all(p.index.uniform for p in self._packs)
        self._slot = slot_shape(ref.codec, ref.shape)  # one record's place in a batch

    def _name(self, indexes: list[PackIndex]) -> str:
        """How messages name this dataset: its manifest, or its first pack and a count."""
        if self._manifest is not None:
            return os.path.basename(self._manifest)
        more = f" (+{len(indexes) - 1} more)" if len(indexes) > 1 else ""
        return indexes[0].data_path.name + more

    # -- pickling: only what reopens the packs; each mapping is made again lazily --------

    def __getstate__(self) -> dict[str, Any]:
        keep = ("_packs", "_manifest", "warnings", "transform", "target_transform")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._describe()

    # -- what the indexes say --------------------------------------------------------

    @property
    def index(self) -> PackIndex:
        """The pack's index; a dataset of many packs has one per pack (``indexes``)."""
        if len(self._packs) > 1:
            raise AttributeError(
                f"a dataset of {len(self._packs)} packs has one index per shard: see ds.indexes"
            )
        return self._packs[0].index

    @property
    def indexes(self) -> list[PackIndex]:
        """Every pack's index, in dataset order."""
        return [p.index for p in self._packs]

    @property
    def path(self) -> str:
        """The manifest, or the (first) pack's .bin (``paths`` has them all)."""
        return self._manifest or str(self._packs[0].index.data_path)

    @property
    def paths(self) -> list[str]:
        """Every pack's .bin, in dataset order."""
        return [str(p.index.data_path) for p in self._packs]

    @property
    def shape(self) -> tuple[int, int, int]:
        """(H, W, C): the bound of every record (each record's own size: ``record_sizes``),
        the size of the canvas a batch is gathered into."""
        return self._packs[0].index.shape

    @property
    def codec(self) -> str:
        """How pixels are stored: "raw" (HWC), "yuv420" or "jpeg" (``ds[i]`` is RGB, or L,
        whichever)."""
        return self._packs[0].index.codec

    @property
    def channels(self) -> int:
        """1 (grayscale) or 3 (RGB): images are uint8 (C, H, W)."""
        return self._packs[0].index.channels

    @property
    def shard_sizes(self) -> tuple[int, ...]:
        """Records in each pack, in dataset order (one pack: ``(len(ds),)``)."""
        return tuple(p.index.count for p in self._packs)

    @property
    def pack_ids(self) -> tuple[str, ...]:
        """Every pack's id, in dataset order."""
        return tuple(p.index.pack_id for p in self._packs)

    @property
    def pack_id(self) -> str:
        """The records' identity (32 hex digits): the pack's own id; for many packs, a digest
        of their ids in this order."""
        ids = self.pack_ids
        if len(ids) == 1:
            return ids[0]
        return hashlib.sha256(",".join(ids).encode("ascii")).hexdigest()[:32]

    @property
    def mean(self) -> tuple[float, ...]:
        """Per-channel mean on the 0..1 scale, exact: the packer's, or from all packs' sums."""
        return self._mean

    @property
    def std(self) -> tuple[float, ...]:
        return self._std

    @property
    def in_page_cache(self) -> bool:
        """True once every pack is known to be in the page cache: read-ahead hints are
        then moot (see ``imgpack.reader.warm``)."""
        return all(p.warm for p in self._packs)

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        h, w, _ = self.shape
        packs = f"{len(self._packs)} shards, " if self._manifest or len(self._packs) > 1 else ""
        return (
            f"PackedImageDataset({self.path!r}, {packs}{len(self)} records, {h}x{w}, "
            f"{len(self.classes)} classes)"
        )

    def locate(self, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        """(pack, record in that pack) for ``indices`` (negatives count from the end)."""
        return packs.locate(self._starts, batch_indices(indices, len(self)))

    def record_names(self, indices: Any) -> list[str]:
        """How errors name records ``indices``: each one's .bin and its number there."""
        pack, local = self.locate(indices)
        return [packs.where(self._packs[p], k) for p, k in zip(pack.tolist(), local.tolist())]

    # -- per-record arrays: each read once on first use, read-only, never pickled -------

    @property
    def record_sizes(self) -> np.ndarray:
        """int64 (N, 2): (width, height) of each record as stored."""
        return self._columns.record_sizes()

    @property
    def record_lengths(self) -> np.ndarray:
        """int64 (N,): bytes of each record as stored (a jpeg record's own length)."""
        return self._columns.record_lengths()

    @property
    def source_sizes(self) -> np.ndarray:
        """int64 (N, 2): (width, height) of each record's source image after EXIF rotation."""
        return self._columns.geometry()[0]

    @property
    def source_boxes(self) -> np.ndarray:
        """float32 (N, 4): (left, top, right, bottom) in source pixels that each record shows."""
        return self._columns.geometry()[1]

    @property
    def content_boxes(self) -> np.ndarray:
        """float32 (N, 4): (left, top, right, bottom) in record pixels where that part lies."""
        return self._columns.geometry()[2]

    @property
    def target_vectors(self) -> np.ndarray | None:
        """float32 (N, K): each record's target vector; None when the packs have none."""
        return self._columns.target_vectors()

    @property
    def labels(self) -> np.ndarray:
        """Every label as one read-only int64 array (read from the files, not the mappings)."""
        return self._columns.labels()

    @property
    def targets(self) -> list[int]:
        """Every label as a list of ints, as ImageFolder has it (``labels`` is the numpy form).

        Built on first use, from one shared int object per class, so it costs one
        pointer per record; it is not pickled to workers.
        """
        return self._columns.targets()

    @property
    def samples(self) -> SourceSamples:
        """(source path, label) per record, read on access (ImageFolder's ``samples``)."""
        return SourceSamples(self._packs, self._starts, self.labels, self.path)

    imgs = samples  # ImageFolder's older name for the same list

    def encoded(self, indices: Any) -> np.ndarray | list[np.ndarray]:
        """Each record's stored bytes (a jpeg stream), zero-copy uint8 views of the mapping:
        what a decoder elsewhere (a GPU's) takes. A sequence of indices gives a list; one
        integer, as ``ds[i]`` takes, gives that record's array alone (the dimension drops,
        as in numpy indexing)."""
        if np.ndim(indices) == 0:
            j = index(indices, len(self))
            return packs.encoded(self._packs, self._starts, np.array([j], dtype=np.intp))[0]
        return packs.encoded(self._packs, self._starts, batch_indices(indices, len(self)))

    def stored(self, first: int, stop: int) -> list[np.ndarray]:
        """The stored bytes of records ``first``..``stop - 1``, end to end, as zero-copy views
        of the mapping: one per pack the run spans (what a resident loader copies)."""
        if not 0 <= first <= stop <= len(self):
            raise IndexError(f"records {first}..{stop} are out of range for {len(self)} records")
        return packs.stored_run(self._packs, self._starts, first, stop)

    def source_path(self, i: Any) -> str:
        """Record ``i``'s source file, relative to the folder that was packed."""
        return packs.source_path(self._packs, self._starts, index(i, len(self)))

    # -- samples: torch's Dataset contract -------------------------------------------

    def _sample(self, j: int, read: Any = None) -> tuple[Any, ...]:
        rec, label = read or packs.record(self._packs, self._starts, j)
        image: Any = torch.from_numpy(rec).permute(2, 0, 1)
        target: Any = int(label)
        if self.transform is not None:
            # its own copy, as ImageFolder gives: an in-place transform (a cutout) on the
            # view would change this record for every later read in this process
            image = self.transform(image.clone())
        if self.target_transform is not None:
            target = self.target_transform(target)
        vectors = self.target_vectors
        if vectors is None:
            return image, target
        return image, target, torch.from_numpy(np.array(vectors[j], dtype=np.float32))

    def __getitem__(self, i: Any) -> tuple[Any, ...]:
        """One sample: (uint8 RGB (C, h, w), int label[, float32 (K,)]); a raw record is a
        view of the mapped file, a yuv420 one converted on the CPU, a jpeg one decoded."""
        return self._sample(index(i, len(self)))

    def __getitems__(self, indices: Any) -> list[tuple[Any, ...]]:
        """A list of samples, as torch's fetcher hands to ``collate_fn`` (one bounds check);
        jpeg records are decoded in threads (``imgpack.reader.threads.POOL``)."""
        idx = batch_indices(indices, len(self)).tolist()
        if self.codec != "jpeg" or len(idx) < 2:
            return [self._sample(j) for j in idx]
        read: list[Any] = [None] * len(idx)

        def work(i: int) -> None:
            read[i] = packs.record(self._packs, self._starts, idx[i])

        POOL.run(len(idx), work, check_threads(None))
        return [self._sample(j, r) for j, r in zip(idx, read)]

    def gather(self, indices: Any) -> tuple[torch.Tensor, ...]:
        """A whole batch as one canvas: uint8 channels_last, int64 (B,)[, targets].

        Raw and jpeg: (B, C, H, W), each record at the top-left of its slot, zero beyond it
        (jpeg decoded in threads). yuv420: the yuv canvas (B, 1, H + ceil(H/2), 2 ceil(W/2))
        of ``imgpack.reader.yuv`` (``canvas_to_rgb`` makes it RGB). The per-sample
        ``transform`` is not applied (``make_loader`` takes a batched one). In a DataLoader
        worker the images live in shared memory from the start.
        """
        idx = batch_indices(indices, len(self)).astype(np.int64)
        jpeg = self.codec == "jpeg"
        read = (Pixels if jpeg else Gather)(self, Setup(SharedMemory(), None if jpeg else 1))
        return read(Batch(idx, self.shape[:2])).output()

    def _copy(self, idx: np.ndarray, images: np.ndarray, labels: np.ndarray) -> None:
        if self._uniform:
            packs.copy_records(self._packs, self._starts, idx, images, labels)
        elif self.codec == "jpeg":
            decode_canvas(self._packs, self._starts, idx, images, labels, None, check_threads(None))
        else:
            copy_canvas(self._packs, self._starts, idx, images, labels)

    def gather_targets(self, indices: Any) -> torch.Tensor | None:
        """float32 (B, K) target vectors of ``indices``, or None when the packs have none."""
        vectors = self.target_vectors
        if vectors is None:
            return None
        idx = batch_indices(indices, len(self))
        return torch.from_numpy(np.ascontiguousarray(vectors[idx], dtype=np.float32))

    def gather_into(
        self, indices: Any, out_images: np.ndarray, out_labels: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Copy records ``indices`` into caller-owned (B, *slot) uint8 and (B,) int64 arrays.

        The slot is (H, W, C) for raw records, (H + ceil(H/2), 2 ceil(W/2), 1) for yuv420
        (``gather``'s canvas before its permute). They must have exactly the batch's shape
        (slice a larger buffer for a short batch).
        """
        idx = batch_indices(indices, len(self))
        check_out(out_images, (len(idx), *self._slot), np.uint8, "out_images")
        check_out(out_labels, (len(idx),), np.int64, "out_labels")
        self._copy(idx, out_images, out_labels)
        return out_images, out_labels

    def decode_into(
        self,
        indices: Any,
        out_images: np.ndarray,
        out_labels: np.ndarray,
        scales: Any = None,
        threads: int | None = None,
        *,
        pad: bool = True,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Records ``indices`` as RGB (or L) pixels, as ``ds[i]`` gives them (raw copied,
        yuv420 converted, jpeg decoded, each jpeg record at 1/``scales[i]``: 1, 2, 4 or 8;
        None: 1), at the top-left of their slots of the (B, H', W', C) uint8 ``out_images``
        (any H' x W' they fit), zero beyond (``pad=False``: left as it was), on ``threads``
        threads (None: the CPUs this process may use); labels into (B,) int64 ``out_labels``.
        jpeg packs: ``out_images`` C-contiguous, or 1-D, taking the records end to end, each
        a C-contiguous (h', w', C) block. raw and yuv420: of any strides (yuv420 converts
        fastest into channel planes: a (B, C, H', W') array's ``transpose(0, 2, 3, 1)``)."""
        idx = batch_indices(indices, len(self))
        b, shape = len(idx), np.shape(out_images)
        if len(shape) == 1 and self.codec != "jpeg":
            raise InvalidArgumentError(
                f"a 1-D out_images takes jpeg records end to end; these are {self.codec}"
            )
        want = tuple(shape) if len(shape) == 1 else (b, *shape[1:3], self.channels)
        check_out(out_images, want, np.uint8, "out_images", contiguous=self.codec == "jpeg")
        check_out(out_labels, (b,), np.int64, "out_labels")
        d = None if scales is None else check_scales(scales, b)
        decode_canvas(self._packs, self._starts, idx, out_images, out_labels, d,
                      check_threads(threads), pad, self.channels)  # fmt: skip
        return out_images, out_labels

    def crops_into(
        self,
        indices: Any,
        boxes: Any,
        flips: Any,
        out_images: np.ndarray,
        out_labels: np.ndarray,
        scales: Any = None,
        threads: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Records ``indices`` read as pixels (as ``decode_into``, jpeg ones at
        1/``scales[i]``), then box i of ``boxes`` (B, 4) (left, top, right, bottom, in those
        pixels, fractional) resampled as Pillow's BILINEAR resize does (on a grid within
        ``cpuresample.ALIGN`` pixels of its) into slot i of the (B, S, S, C) uint8
        ``out_images``, mirrored left-right where ``flips[i]``: the crops of
        ``DeviceTransform.train``/``.eval``, made on the CPU (``cpuresample``). On
        ``threads`` threads (None: the CPUs this process may use); labels into (B,) int64
        ``out_labels``."""
        idx = batch_indices(indices, len(self))
        b, shape = len(idx), np.shape(out_images)
        size = shape[1] if len(shape) == 4 else 0
        check_out(out_images, (b, size, size, self.channels), np.uint8, "out_images")
        check_out(out_labels, (b,), np.int64, "out_labels")
        try:
            box = np.asarray(boxes, dtype=np.float64)
        except (TypeError, ValueError):
            box = np.empty(0)
        flip = np.asarray(flips)
        if box.shape != (b, 4) or flip.shape != (b,) or flip.dtype != bool:
            raise InvalidArgumentError(
                f"boxes should be float ({b}, 4) and flips bool ({b},), found {box.shape} and "
                f"{flip.dtype} {flip.shape}"
            )
        d = None if scales is None else check_scales(scales, b)
        crop_canvas(self._packs, self._starts, idx, box, flip, out_images, out_labels, d,
                    check_threads(threads))  # fmt: skip
        return out_images, out_labels

    def will_need(self, indices: Any) -> None:
        """Ask the kernel to start reading records ``indices`` (MADV_WILLNEED), if supported."""
        packs.will_need(self._packs, self._starts, batch_indices(indices, len(self)))

    # -- cleanup -------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap every pack now (the next access maps again). Tensors still viewing records
        keep their pages alive."""
        for p in self._packs:
            p.close()

    def __enter__(self) -> PackedImageDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
