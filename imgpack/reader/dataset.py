"""``PackedImageDataset``: a map-style torch Dataset served zero-copy from mapped packs.

It keeps torch's Dataset contract exactly, so a plain ``DataLoader`` with the default
collate works (on packs whose records share one size): ``ds[i]`` is one sample ``(uint8
RGB (C, h_i, w_i) tensor, int label)`` at the record's own size (plus a float32 target
vector when the packs have them) and ``ds.__getitems__(indices)`` a list of such samples.
ImageFolder's names mean what they mean there. The fast path is ``ds.gather(indices)``:
a whole batch as one canvas, uint8 in channels_last memory (records are stored HWC, so
no transpose is paid): one ``np.take`` per pack where every record fills the bound as raw
pixels, else record by record into a canvas padded with zeros (``Packs.copy``;
a yuv420 pack's batch stays yuv420 until the loader's delivery). ``make_loader`` calls
it, the default collate never sees it.

Many packs (a list, or a manifest written by ``pack-images merge``) are one dataset, their
records in order; one pack is the case of one. Each per-record feature is written once, in
terms of (pack, record in the pack), in ``Packs`` (below). Indexes are validated
at construction, so a damaged pack fails at open; each .bin is mapped lazily, once per
process (``mapping.PackMapping``), and the dataset pickles as its small indexes only, so
it works in DataLoader workers under fork and spawn.

**Packs**: the records of one or many packs as one run, record ``i`` being (pack p, record
i - starts[p]).

``Packs`` holds a ``PackMapping`` per pack and ``starts``, the cumulative record counts;
every per-record read is written here once, in terms of (pack, local index). A pack is found
with one ``np.searchsorted`` in ``starts``: no per-sample Python objects, so forked workers
stay flat however many records there are. A batch is split by pack with one stable argsort,
and each pack's part goes straight from its mapping into its place in the output.

A batch into its canvas (each record at the top-left of its slot, zero beyond: every byte of
a slot is written, so a reused buffer never shows an older batch):

``copy``     records as stored (``canvas.slot_shape``); where every record fills the bound
             as raw HWC, one ``np.take`` per pack, else record by record (``canvas.put``).
``pixels``   RGB (or L) pixels (H', W', C) of yuv420 and jpeg records: a yuv420 one converted
             (``imgpack.format.codec.yuv420_to_rgb``, straight into the slot), a jpeg one
             decoded (``imgpack.reader.jpeg``) at its stored size or at 1/d of it; H' x W'
             is the bound, or any canvas the decoded records fit.
``crops``    each record's pixels (a view of the mapping where they are stored as they
             are, else read into a buffer of its thread's), then its crop box resampled into
             an S x S slot (``resample.crop_each``): the CPU's ``DeviceTransform.train``/``.eval``.

``open_packs`` turns what the user passed into the packs' indexes: a .bin or .json, a
manifest written by ``pack-images merge`` (its shards checked against it), or a sequence
of packs (checked together by ``imgpack.shards``).
"""

from __future__ import annotations

import contextlib
import hashlib
import operator
import os
from collections.abc import Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from imgpack.classlist import check_same_classes
from imgpack.errors import InvalidArgumentError
from imgpack.format.codec import yuv420_to_rgb
from imgpack.format.index import PackIndex, read_index
from imgpack.reader.canvas import put
from imgpack.reader.jpeg import decode, scaled_size
from imgpack.reader.mapping import PackMapping, auto_prefault
from imgpack.reader.read import Batch, BufferPool, Gather, Pixels
from imgpack.reader.resample import crop_each
from imgpack.reader.run import POOL, check_threads
from imgpack.remote import has_url
from imgpack.shards import check_shards, combine_stats, is_manifest, open_shards

__all__ = ["PackedImageDataset", "Packs", "SourceSamples", "open_packs", "index", "batch_indices"]


def index(i: Any, n: int) -> int:
    """One sample index: any integer (numpy, 0-d tensor), negative counts from the end."""
    try:
        j = operator.index(i)
    except TypeError:
        raise TypeError(f"dataset indices must be integers, not {type(i).__name__}") from None
    if not -n <= j < n:
        raise IndexError(f"index {i} is out of range for a pack of {n} records")
    return j % n  # a negative one counted from the end


def batch_indices(indices: Any, n: int | None) -> np.ndarray:
    """A 1-D intp array of in-range indices (negatives wrapped), or TypeError/IndexError: the
    one check of a batch's record indices (``DeviceTransform``'s ``records`` too). ``n``
    None: a dataset without ``len()``, whose own indexing bounds them."""
    idx = np.asarray(indices)
    if idx.size == 0:
        return np.empty(0, dtype=np.intp)
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        raise TypeError(
            f"batch indices must be a 1-D sequence of integers, got {idx.dtype} {idx.shape}"
        )
    idx = idx.astype(np.intp, copy=False)
    if n is None:
        return idx
    lo, hi = int(idx.min()), int(idx.max())
    index(lo if lo < -n else hi, n)  # an index out of range, the lowest first: IndexError
    return idx % n if lo < 0 else idx  # negatives counted from the end


# Above this record size a batch spread over several packs is copied row by row into place
# (one copy, a Python step per record); below it, each pack's rows are gathered with
# np.take and then scattered (two copies, no Python step per record).
_ROW_COPY_BYTES = 16 << 10


def open_packs(source: Any, *, allow_partial: bool = False) -> tuple[list, str | None, list]:
    """(the indexes of ``source``, the manifest's path when it is one, what a partial set of
    shards lacks): one pack, a manifest, or a sequence of packs.

    A sequence is checked as shards of one dataset (``FormatError`` naming the
    pack); ``allow_partial`` accepts a sharded source with shards missing. A manifest
    records its own choice, and a single pack is never a partial anything.
    """
    if isinstance(source, (str, bytes, os.PathLike)):
        path = os.fsdecode(source)
        manifest = str(Path(path)) if is_manifest(path) else None
        return (open_shards(path) if manifest else [read_index(path)]), manifest, []
    try:  # a path of another type (an int, None) is a one-line error, not a TypeError
        paths = [os.fsdecode(p) for p in source]
    except TypeError:
        raise InvalidArgumentError(
            f"path should be a pack (.bin or .json), a manifest or a list of them, found {source!r}"
        ) from None
    indexes: list[PackIndex] = [read_index(p) for p in paths]
    return indexes, None, check_shards(indexes, paths, allow_partial=allow_partial)


_LOCAL = contextlib.nullcontext()  # a local pack's records need nothing fetched (made once:
# ``ds[i]`` asks for each sample)


class Packs:
    """The records of ``packs`` (a ``PackMapping`` each) as one run (module docstring);
    every index given to a method is in range already."""

    def __init__(self, packs: list[PackMapping], remote: Any = None) -> None:
        self.packs, self.remote = packs, remote  # remote: a pack at a URL (imgpack.remote)
        self.starts = np.cumsum([0, *(p.index.count for p in packs)], dtype=np.int64)
        self.codec, self.shape = packs[0].index.codec, packs[0].index.shape
        # a remote pack under a cache limit: the bytes of records one read may pin at once
        self.pin_bytes = None if remote is None else remote.pin_bytes

    def one(self, j: int) -> tuple[PackMapping, int]:
        """(pack, record in that pack) of one global index."""
        p = int(np.searchsorted(self.starts, j, side="right")) - 1
        return self.packs[p], j - int(self.starts[p])

    def groups(self, idx: np.ndarray) -> Iterator[tuple[PackMapping, np.ndarray, np.ndarray]]:
        """(pack, positions in the batch (ascending), records in the pack) per pack touched."""
        if len(self.packs) == 1 and len(idx):  # the usual case at once: the search below
            yield self.packs[0], np.arange(len(idx)), idx  # costs more than a small batch's copy
            return
        pack = np.searchsorted(self.starts, idx, side="right") - 1
        local, order = idx - self.starts[pack], np.argsort(pack, kind="stable")
        for pos in np.split(order, np.flatnonzero(np.diff(pack[order])) + 1):
            if len(pos):
                yield self.packs[int(pack[pos[0]])], pos, local[pos]

    def record(self, j: int) -> tuple[np.ndarray, Any]:
        """Record ``j`` as uint8 RGB (h, w, C) at its own size, and its label.

        A raw record is a view of its pack's mapping, copy-on-write: writing to it changes
        only this process's copy of the page, never the file (a copy instead on the
        read-only fallback mapping). A yuv420 record is converted, a jpeg one decoded.
        """
        pack, k = self.one(j)
        (w, h), c = pack.index.record_sizes[k].tolist(), self.shape[2]
        out = np.empty((c, h, w), np.uint8).transpose(1, 2, 0) if self.codec == "yuv420" else None
        rec = self._into(pack, k, w, h, 1, out)  # yuv420: into channel planes, fastest there
        return (rec if rec.flags.writeable else rec.copy()), pack.views["labels"][k]

    def _into(self, pack: PackMapping, k: int, w: int, h: int, d: int, out: Any = None):
        """Record ``k`` of ``pack`` (``w`` x ``h``) as pixels at 1/``d``, written into ``out``
        (an (h', w', C) uint8 view; C-contiguous for jpeg: the decoder has no row pitch) or
        returned. A raw record is always returned, as a view of the mapping, ``out`` unused: raw
        packs are read by ``copy`` (the loader's ``read.Gather``) or cropped from that view."""
        stored, c = pack.stored(k), pack.index.channels
        if self.codec == "yuv420":
            return yuv420_to_rgb(stored, w, h, out=out)
        if self.codec == "jpeg":
            where = f"{pack.index.data_path} record {k}"
            return decode(stored, w, h, c, scale=d, where=where, out=out)
        return stored.reshape(h, w, c)

    def fetched(self, idx: Any) -> Any:
        """A context in which records ``idx`` (in range) are in a remote pack's cache:
        fetched if need be, and kept while it runs; nothing to do for a local pack."""
        return _LOCAL if self.remote is None else self.remote.reading(self.starts, idx)

    def ahead(self, batches: Any, done: Any) -> Any:
        """A remote pack's prefetch of ``batches`` (``close()`` it); None for a local one."""
        return None if self.remote is None else self.remote.ahead(self.starts, batches, done)

    def stored(self, first: int, stop: int) -> list[np.ndarray]:
        """The stored bytes of records first..stop-1, end to end: one flat view of its
        mapping per pack the run spans (a remote one's fetched block by block)."""
        if self.remote is not None:
            return self.remote.stored(self.starts, first, stop, self._stored)
        return self._stored(first, stop)

    def _stored(self, first: int, stop: int) -> list[np.ndarray]:
        # the run clipped to each pack's records, in that pack's numbering
        lo, hi = self.starts[:-1, None], self.starts[1:, None]
        parts = (np.clip([first, stop], lo, hi) - lo).tolist()
        return [pack.stored(a, b) for pack, (a, b) in zip(self.packs, parts) if a < b]

    def will_need(self, idx: np.ndarray) -> None:
        """MADV_WILLNEED on the pages of records ``idx``, pack by pack."""
        for pack, _, local in self.groups(idx):
            pack.will_need(local)

    def copy(self, idx: np.ndarray, out: np.ndarray, labels: np.ndarray) -> None:
        """Records ``idx`` as stored into the (B, *slot) canvas ``out``, labels into (B,)
        ``labels``: a pack whose records all fill the bound as raw HWC (``uniform``) in one
        ``np.take``, any other record by record."""
        # mode="clip" lets numpy write straight into ``out`` (mode="raise" buffers the whole
        # result first: a second copy of the batch); indices were checked already
        for pack, pos, local in self.groups(idx):
            ix, pixels = pack.index, pack.views["pixels"]
            labels[pos] = pack.views["labels"][local]
            lo, hi = int(pos[0]), int(pos[-1]) + 1
            if not ix.uniform:
                for i, k in zip(pos.tolist(), local.tolist()):
                    w, h = ix.record_sizes[k].tolist()
                    put(out[i], pack.stored(k), w, h, ix.codec, ix.height)
            elif hi - lo == len(pos):  # a run of the batch: one np.take, in place
                np.take(pixels, local, axis=0, out=out[lo:hi], mode="clip")
            elif out[0].nbytes >= _ROW_COPY_BYTES:  # a record's bytes
                for i, k in zip(pos.tolist(), local.tolist()):
                    out[i] = pixels[k]
            else:
                out[pos] = np.take(pixels, local, axis=0, mode="clip")

    def _decoded(self, idx: np.ndarray, labels: np.ndarray, scales: Any) -> list:
        """Labels of ``idx`` into ``labels``; per record (pack, k, w, h, d): where it lies, its
        size and its decode's scale (1 unless ``scales``, for jpeg records)."""
        d = [1] * len(idx) if scales is None else np.asarray(scales, np.int64).tolist()
        jobs: list = [None] * len(idx)
        for pack, pos, local in self.groups(idx):
            labels[pos] = pack.views["labels"][local]
            sizes = pack.index.record_sizes[local].tolist()
            for i, k, (w, h) in zip(pos.tolist(), local.tolist(), sizes):
                jobs[i] = pack, k, w, h, d[i]
        return jobs

    def pixels(self, idx, out, labels, scales=None, pad: bool = True) -> None:
        """yuv420 or jpeg records ``idx`` as RGB (or L) pixels, jpeg ones decoded at
        1/``scales[i]`` (default 1), into the top-left of their slots of the C-contiguous
        (B, H', W', C) ``out``, zero beyond (``pad=False``: beyond is left as it was, for a
        consumer that reads only each record's own extent); labels into (B,) ``labels``."""
        for slot, job in zip(out, self._decoded(idx, labels, scales)):
            sw, sh = scaled_size(job[2], job[3], job[4])
            if sw == out.shape[2] or self.codec != "jpeg":  # straight into the slot
                self._into(*job, slot[:sh, :sw])
            else:  # simplejpeg has no row pitch: decode, then copy into the slot
                slot[:sh, :sw] = self._into(*job)
            if pad:
                slot[:sh, sw:] = 0
                slot[sh:] = 0

    def crops(self, idx, boxes, flips, out, labels) -> None:
        """Records ``idx`` read as pixels, then box i of float (B, 4) ``boxes`` (in those
        pixels) resampled into slot i of the (B, S, S, C) ``out``, mirrored where
        ``flips[i]``; labels into (B,) ``labels``."""
        jobs, c = self._decoded(idx, labels, None), self.shape[2]
        scratch = np.empty(int(np.prod(self.shape)), np.uint8)  # a record's pixels, in turn

        def pixels(i: int) -> np.ndarray:  # a raw record: its view (``_into`` uses no out)
            w, h = jobs[i][2:4]
            return self._into(*jobs[i], scratch[: w * h * c].reshape(h, w, c))

        crop_each(pixels, boxes, flips, out, 1)


class SourceSamples(Sequence):
    """``ds.samples``: (source path, label) pairs, each path read from its pack when asked for."""

    def __init__(self, ds: PackedImageDataset) -> None:
        self._ds = ds

    def __len__(self) -> int:
        return len(self._ds)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return self._ds.source_path(i), int(self._ds.labels[index(i, len(self))])

    def __repr__(self) -> str:
        return f"<{len(self)} (source path, label) pairs of {self._ds.path}>"


class PackedImageDataset(Dataset):
    """Samples of one pack or many: ``ds[i]`` is (uint8 RGB (C, h, w), int label[, targets]).

    ``path`` names a pack (its .bin or .json), a manifest written by ``pack-images merge``,
    or a sequence of packs, read as one dataset in the order given; packs of a sequence
    must agree (``FormatError`` names the one that does not), and ``allow_partial``
    accepts a sharded source with shards missing (a manifest records its own choice).
    ``transform`` (on the uint8 image tensor) and ``target_transform`` (on the int label)
    run per sample, as in ImageFolder. ``advice`` ("random", "sequential", "normal") is
    passed to madvise on the pixels; ``prefault`` warms the page cache with every pack in
    the background, once per node (see ``imgpack.reader.mapping``); ``None`` means: only on
    Linux, and only when the pixels of all packs take less than half of MemAvailable.
    ``classes_from`` (another pack, a manifest, a class-list file, a dataset or a list of
    names) raises ``ClassMismatchError`` unless these packs have exactly those classes.
    ``path`` may be a URL (``s3://``, ``gs://``, ``https://``... : ``imgpack.remote``); then
    ``cache_dir``, ``cache_limit`` (bytes or "50GB") and ``storage_options`` say where its
    blocks are kept, how much disk they may take, and how the store is reached.
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
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
    ):
        self._remote = None  # a pack at a URL: its local cache (imgpack.remote)
        if has_url(path) or cache_dir or cache_limit or storage_options:
            from imgpack.remote.mirror import open_remote

            path, self._remote = open_remote(path, cache_dir=cache_dir, cache_limit=cache_limit,
                                             storage_options=storage_options)  # fmt: skip
        indexes, self._manifest, self.warnings = open_packs(path, allow_partial=allow_partial)
        # what prefault=None means is decided once, for all packs together
        nbytes = sum(ix.sections["pixels"].nbytes for ix in indexes)
        auto = self._remote is None and auto_prefault(nbytes)
        self._packs = [
            PackMapping(ix, advice=advice, prefault=prefault, auto=auto) for ix in indexes
        ]
        self.transform, self.target_transform = transform, target_transform
        self._describe()
        if classes_from is not None:  # the packs agree on classes: named by the first
            check_same_classes(self.classes, classes_from, what=os.path.basename(self.path))

    def _describe(self) -> None:
        """What follows from the packs (again after unpickling): geometry, classes, stats."""
        ref = self._packs[0].index
        # every pack's index, in dataset order (one pack: a list of one); each names its .bin
        # as ``data_path``
        self.indexes: list[PackIndex] = [p.index for p in self._packs]
        # the manifest, or the (first) pack's .bin (``indexes`` name them all)
        self.path: str = self._manifest or str(ref.data_path)
        # (H, W, C): the bound of every record (each record's own size: ``record_sizes``), the
        # size of the canvas a batch is gathered into; how pixels are stored: "raw" (HWC),
        # "yuv420" or "jpeg" (``ds[i]`` is RGB, or L, whichever); 1 (grayscale) or 3 channels
        self.shape, self.codec, self.channels = ref.shape, ref.codec, ref.channels
        self._shard_sizes = tuple(ix.count for ix in self.indexes)  # what shard-local deals
        self._run, self._warm = Packs(self._packs, self._remote), False
        if self._remote is not None:
            self._remote.attach(self.indexes)
        self.classes: list[str] = list(ref.classes)
        self.class_to_idx: dict[str, int] = {c: i for i, c in enumerate(self.classes)}
        # per-channel mean and std on the 0..1 scale, exact: from the sum of every pack's
        # integer sums (for one pack, the packer's own figures, made from its sums alike)
        stats = combine_stats(self.indexes)
        self.mean, self.std = tuple(stats["mean"]), tuple(stats["std"])
        # the records' identity (32 hex digits): the pack's own id; for many packs, a digest
        # of their ids in this order (each pack's: ``indexes[k].pack_id``)
        ids = ",".join(ix.pack_id for ix in self.indexes)
        digest = hashlib.sha256(ids.encode("ascii")).hexdigest()[:32]
        self.pack_id: str = ids if len(self.indexes) == 1 else digest

    # -- pickling: only what reopens the packs; each mapping is made again lazily --------

    def __getstate__(self) -> dict[str, Any]:
        keep = ("_packs", "_manifest", "warnings", "transform", "target_transform", "_remote")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._describe()

    # -- what the loader asks (private to the reader) -------------------------------
    # ``_run`` (a ``Packs``) reads the records of every pack as one run: the read
    # stages fill their batches through it (``copy``, ``pixels``, ``crops``), the loader
    # announces reads (``will_need``), a resident loader copies stored bytes (``stored``).

    @property
    def _in_page_cache(self) -> bool:
        """True once every pack is known to be in the page cache: read-ahead hints are
        then moot (see ``imgpack.reader.mapping``). Once True it stays True: a dataset of many
        packs then asks none of them again, batch after batch."""
        self._warm = self._warm or all(p.warm for p in self._packs)
        return self._warm

    @cached_property
    def _fills(self) -> bool:
        """Whether every record fills the bound: then a batch needs no per-record sizes."""
        h, w, _ = self.shape
        return bool((self.record_sizes == np.array([w, h])).all())

    def _gather_targets(self, idx: Any) -> torch.Tensor | None:
        """float32 (B, K) target vectors of ``idx`` (one record: (K,)), a copy of their own,
        or None when the packs have none."""
        vectors = self.target_vectors
        return None if vectors is None else torch.tensor(vectors[idx], dtype=torch.float32)

    def __len__(self) -> int:
        return int(self._run.starts[-1])

    def __repr__(self) -> str:
        h, w, _ = self.shape
        packs = f"{len(self._packs)} shards, " if self._manifest or len(self._packs) > 1 else ""
        holds = f"{len(self)} records, {h}x{w}, {len(self.classes)} classes"
        return f"PackedImageDataset({self.path!r}, {packs}{holds})"

    # -- per-record arrays: each read once on first use, read-only, never pickled -------

    def _column(self, read: Callable[[PackIndex], Any]) -> Any:
        """One read-only column of every pack's rows, in dataset order; None where the packs
        have none (the packs of one dataset all have a column, or none does)."""
        parts = [read(ix) for ix in self.indexes]
        if parts[0] is None:
            return None
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        out.flags.writeable = False
        return out

    # int64 (N, 2): (width, height) of each record as stored
    record_sizes = cached_property(lambda self: self._column(lambda ix: ix.record_sizes))
    # int64 (N,): bytes of each record as stored (a jpeg record's own length)
    _record_lengths = cached_property(lambda self: self._column(lambda ix: ix.record_lengths))
    # int64 (N, 2): (width, height) of each record's source image after EXIF rotation
    source_sizes = cached_property(lambda self: self._column(lambda ix: ix.geometry()[0]))
    # float32 (N, 4): (left, top, right, bottom) in source pixels that each record shows
    source_boxes = cached_property(lambda self: self._column(lambda ix: ix.geometry()[1]))
    # float32 (N, 4): (left, top, right, bottom) in record pixels where that part lies
    content_boxes = cached_property(lambda self: self._column(lambda ix: ix.geometry()[2]))

    # float32 (N, K): each record's target vector; None when the packs have none
    target_vectors = cached_property(lambda self: self._column(lambda ix: ix.target_vectors()))

    @cached_property
    def labels(self) -> np.ndarray:
        """Every label as one read-only int64 array (read from the files, not the mappings)."""
        return self._column(lambda ix: ix.read_section("labels").astype(np.int64))

    @cached_property
    def targets(self) -> list[int]:
        """Every label as a list of ints, as ImageFolder has it (``labels`` is the numpy form).

        Built on first use, from one shared int object per class, so it costs one
        pointer per record; it is not pickled to workers.
        """
        lab = self.labels
        lo, hi = (int(lab.min()), int(lab.max())) if lab.size else (0, 0)
        return np.array(list(range(lo, hi + 1)), dtype=object)[lab - lo].tolist()

    @property
    def samples(self) -> SourceSamples:
        """(source path, label) per record, read on access (ImageFolder's ``samples``)."""
        return SourceSamples(self)

    def source_path(self, i: Any) -> str:
        """Record ``i``'s source file, relative to the folder that was packed."""
        pack, k = self._run.one(index(i, len(self)))
        return pack.source_path(k)

    # -- samples: torch's Dataset contract -------------------------------------------

    def _sample(self, j: int, read: Any = None) -> tuple[Any, ...]:
        rec, label = read or self._run.record(j)
        # a view may outlive a remote pack's cached block (imgpack.remote)
        rec = rec if self._remote is None else self._remote.own(rec)
        image: Any = torch.from_numpy(rec).permute(2, 0, 1)
        target: Any = int(label)
        if self.transform is not None:
            # its own copy, as ImageFolder gives: an in-place transform (a cutout) on the
            # view would change this record for every later read in this process
            image = self.transform(image.clone())
        if self.target_transform is not None:
            target = self.target_transform(target)
        targets = self._gather_targets(j)
        return (image, target) if targets is None else (image, target, targets)

    def __getitem__(self, i: Any) -> tuple[Any, ...]:
        """One sample: (uint8 RGB (C, h, w), int label[, float32 (K,)]); a raw record is a
        view of the mapped file, a yuv420 one converted on the CPU, a jpeg one decoded."""
        j = index(i, len(self))
        with self._run.fetched(j):
            return self._sample(j)

    def __getitems__(self, indices: Any) -> list[tuple[Any, ...]]:
        """A list of samples, as torch's fetcher hands to ``collate_fn`` (one bounds check);
        jpeg records are decoded in threads (``imgpack.reader.run.POOL``)."""
        idx = batch_indices(indices, len(self)).tolist()
        read: list[Any] = [None] * len(idx)

        def work(i: int) -> None:
            read[i] = self._run.record(idx[i])

        with self._run.fetched(idx):
            POOL.run(len(idx), work, check_threads(None) if self.codec == "jpeg" else 1)
            return [self._sample(j, r) for j, r in zip(idx, read)]

    def gather(self, indices: Any) -> tuple[torch.Tensor, ...]:
        """A whole batch as one canvas: uint8 channels_last, int64 (B,)[, targets].

        Raw and jpeg: (B, C, H, W), each record at the top-left of its slot, zero beyond it
        (jpeg decoded in threads). yuv420: the yuv canvas (B, 1, H + ceil(H/2), 2 ceil(W/2))
        of ``imgpack.reader.device`` (``canvas_to_rgb`` makes it RGB). The per-sample
        ``transform`` is not applied (``make_loader`` takes a batched one). In a DataLoader
        worker the images live in shared memory from the start.
        """
        read = (Pixels if self.codec == "jpeg" else Gather)(self, BufferPool(), None)
        return read(Batch(batch_indices(indices, len(self)), self.shape[:2])).output()

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
