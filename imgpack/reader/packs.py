"""The records of one or many packs as one run: record ``i`` is (pack p, record i - starts[p]).

``Packs`` holds a ``PackMapping`` per pack and ``starts``, the cumulative record counts;
every per-record read is written here once, in terms of (pack, local index). A pack is found
with one ``np.searchsorted`` in ``starts``: no per-sample Python objects, so forked workers
stay flat however many records there are. A batch is split by pack with one stable argsort,
and each pack's part goes straight from its mapping into its place in the output.

A batch into its canvas (each record at the top-left of its slot, zero beyond: every byte of
a slot is written, so a reused buffer never shows an older batch):

``copy``     records as stored (``canvas.slot_shape``); where every record fills the bound
             as raw HWC, one ``np.take`` per pack, else record by record (``canvas.put``).
``pixels``   RGB (or L) pixels (H', W', C): a raw record copied, a yuv420 one converted
             (``imgpack.format.codec.yuv420_to_rgb``, straight into the slot), a jpeg one
             decoded (``imgpack.reader.jpeg``) at its stored size or at 1/d of it; H' x W'
             is the bound, or any canvas the decoded records fit.
``crops``    each record's pixels (a view of the mapping where they are stored as they
             are, else read into a buffer of its thread's), then its crop box resampled into
             an S x S slot (``canvas.crop_each``): the CPU's ``DeviceTransform.train``/``.eval``.

``open_packs`` turns what the user passed into the packs' indexes: a .bin or .json, a
manifest written by ``pack-images merge`` (its shards checked against it), or a sequence
of packs (checked together by ``imgpack.shards``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.errors import InvalidArgumentError
from imgpack.format.codec import yuv420_to_rgb
from imgpack.format.index import PackIndex, read_index
from imgpack.reader.canvas import crop_each, put
from imgpack.reader.jpeg import decode, scaled_size
from imgpack.reader.mapping import PackMapping
from imgpack.shards import check_shards, is_manifest, open_shards

__all__ = ["Packs", "open_packs"]

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
        if is_manifest(path):
            return open_shards(path), str(Path(path)), []
        return [read_index(path)], None, []
    try:  # a path of another type (an int, None) is a one-line error, not a TypeError
        paths = [os.fsdecode(p) for p in source]
    except TypeError:
        raise InvalidArgumentError(
            f"path should be a pack (.bin or .json), a manifest or a list of them, found {source!r}"
        ) from None
    indexes: list[PackIndex] = [read_index(p) for p in paths]
    return indexes, None, check_shards(indexes, paths, allow_partial=allow_partial)


_LOCAL = contextlib.nullcontext()  # a local pack's records need nothing fetched


class Packs:
    """The records of ``packs`` (a ``PackMapping`` each) as one run (module docstring);
    every index given to a method is in range already."""

    def __init__(self, packs: list[PackMapping], remote: Any = None) -> None:
        self.packs, self.remote = packs, remote  # remote: a pack at a URL (imgpack.remote)
        counts = [p.index.count for p in packs]
        self.starts = np.concatenate(([0], np.cumsum(counts, dtype=np.int64))).astype(np.int64)
        self.codec, self.shape = packs[0].index.codec, packs[0].index.shape
        # a remote pack under a cache limit: the bytes of records one read may pin at once
        self.pin_bytes = None if remote is None else remote.pin_bytes

    def one(self, j: int) -> tuple[PackMapping, int]:
        """(pack, record in that pack) of one global index."""
        p = int(np.searchsorted(self.starts, j, side="right")) - 1
        return self.packs[p], j - int(self.starts[p])

    def groups(self, idx: np.ndarray) -> Iterator[tuple[PackMapping, np.ndarray, np.ndarray]]:
        """(pack, positions in the batch (ascending), records in the pack) per pack touched."""
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
        ix, v = pack.index, pack.views
        (w, h), c = ix.record_sizes[k].tolist(), ix.channels
        out = np.empty((c, h, w), np.uint8).transpose(1, 2, 0) if ix.codec == "yuv420" else None
        rec = self._into(pack, k, w, h, 1, out)  # yuv420: into channel planes, fastest there
        return (rec if v.writable or ix.codec != "raw" else rec.copy()), v.labels[k]

    def _into(self, pack: PackMapping, k: int, w: int, h: int, d: int, out: Any = None):
        """Record ``k`` of ``pack`` (``w`` x ``h``) as pixels at 1/``d``, written into ``out``
        (an (h', w', C) uint8 view; C-contiguous for jpeg: the decoder has no row pitch) or
        returned (a raw one as a view of the mapping)."""
        stored, c = pack.stored(k), pack.index.channels
        if self.codec == "yuv420":
            return yuv420_to_rgb(stored, w, h, out=out)
        if self.codec == "jpeg":
            where = f"{pack.index.data_path} record {k}"
            return decode(stored, w, h, c, scale=d, where=where, out=out)
        if out is None:
            return stored.reshape(h, w, c)
        np.copyto(out, stored.reshape(h, w, c))
        return out

    def source_path(self, j: int) -> str:
        """Record ``j``'s source file, relative to the folder that was packed."""
        pack, k = self.one(j)
        return pack.source_path(k)

    def fetched(self, idx: Any) -> Any:
        """A context in which records ``idx`` (in range) are in a remote pack's cache:
        fetched if need be, and kept while it runs; nothing to do for a local pack."""
        if self.remote is None:
            return _LOCAL
        return self.remote.reading(self.starts, idx)

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
        out = []
        for p, pack in enumerate(self.packs):
            a, b = max(first, int(self.starts[p])), min(stop, int(self.starts[p + 1]))
            if a < b:
                out.append(pack.stored(a - int(self.starts[p]), b - int(self.starts[p])))
        return out

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
        if len(self.packs) == 1 and self.packs[0].index.uniform:  # the usual case, at once
            v = self.packs[0].views
            labels[:] = v.labels[idx]
            np.take(v.pixels, idx, axis=0, out=out, mode="clip")
            return
        rows = out[:1].nbytes >= _ROW_COPY_BYTES  # a record's bytes (none in an empty batch)
        for pack, pos, local in self.groups(idx):
            ix, v = pack.index, pack.views
            labels[pos] = v.labels[local]
            lo, hi = int(pos[0]), int(pos[-1]) + 1
            if not ix.uniform:
                for i, k in zip(pos.tolist(), local.tolist()):
                    w, h = ix.record_sizes[k].tolist()
                    put(out[i], pack.stored(k), w, h, ix.codec, ix.height)
            elif hi - lo == len(pos):  # a run of the batch: one np.take, in place
                np.take(v.pixels, local, axis=0, out=out[lo:hi], mode="clip")
            elif rows:
                for i, k in zip(pos.tolist(), local.tolist()):
                    out[i] = v.pixels[k]
            else:
                out[pos] = np.take(v.pixels, local, axis=0, mode="clip")

    def _decoded(self, idx: np.ndarray, labels: np.ndarray, scales: Any) -> list:
        """Labels of ``idx`` into ``labels``; per record (pack, k, w, h, d): where it lies, its
        size and its decode's scale (1 unless ``scales``, for jpeg records)."""
        d = [1] * len(idx) if scales is None else np.asarray(scales, np.int64).tolist()
        jobs: list = [None] * len(idx)
        for pack, pos, local in self.groups(idx):
            labels[pos] = pack.views.labels[local]
            sizes = pack.index.record_sizes[local].tolist()
            for i, k, (w, h) in zip(pos.tolist(), local.tolist(), sizes):
                jobs[i] = pack, k, w, h, d[i]
        return jobs

    def pixels(self, idx, out, labels, scales=None, pad: bool = True) -> None:
        """Records ``idx`` as pixels, jpeg ones decoded at 1/``scales[i]`` (default 1), into
        the top-left of their slots of the C-contiguous (B, H', W', C) ``out``, zero beyond
        (``pad=False``: beyond is left as it was, for a consumer that reads only each
        record's own extent); labels into (B,) ``labels``."""
        cols = out.shape[2]
        for slot, job in zip(out, self._decoded(idx, labels, scales)):
            sw, sh = scaled_size(job[2], job[3], job[4])
            if sw == cols or self.codec != "jpeg":  # straight into the slot
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

        def pixels(i: int) -> np.ndarray:
            if self.codec == "raw":
                return self._into(*jobs[i])
            w, h = jobs[i][2:4]
            return self._into(*jobs[i], scratch[: w * h * c].reshape(h, w, c))

        crop_each(pixels, boxes, flips, out, 1)
