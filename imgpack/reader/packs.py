"""The records of one or many packs as one run: record ``i`` is (pack p, record i - starts[p]).

``PackedImageDataset`` holds a list of ``PackMapping`` (one per pack) and ``starts``, the
cumulative record counts; every per-record feature is written here once, in terms of
(pack, local index). A pack is found with one ``np.searchsorted`` in ``starts``: no
per-sample Python objects, so forked workers stay flat however many records there are.
A batch is split by pack with one stable argsort, and each pack's part is copied straight
from its mapping into its place in the output; one pack is one ``np.take``, nothing split.

``open_packs`` turns what the user passed into the packs' indexes: a .bin or .json, a
manifest written by ``pack-images merge`` (its shards checked against it), or a sequence
of packs (checked together by ``imgpack.shards``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from imgpack.format.codec import yuv420_to_rgb
from imgpack.format.index import PackIndex, read_index
from imgpack.manifest import is_manifest, open_shards, read_manifest
from imgpack.reader.jpeg import decode
from imgpack.reader.mapping import PackMapping
from imgpack.shards import check_shards

__all__ = [
    "Opened",
    "open_packs",
    "starts_of",
    "locate",
    "record",
    "where",
    "groups",
    "copy_records",
    "stored_run",
    "will_need",
    "source_path",
]

# Above this record size a batch spread over several packs is copied row by row into place
# (one copy, a Python step per record); below it, each pack's rows are gathered with
# np.take and then scattered (two copies, no Python step per record).
_ROW_COPY_BYTES = 16 << 10


class Opened(NamedTuple):
    """The packs a source names, in dataset order."""

    indexes: list[PackIndex]
    manifest: str | None  # the manifest's path, when the source was one
    warnings: list[str]  # what a partial set of shards lacks


def open_packs(source: Any, *, allow_partial: bool = False) -> Opened:
    """Read the indexes of ``source``: one pack, a manifest, or a sequence of packs.

    A sequence is checked as shards of one dataset (``FormatError`` naming the
    pack); ``allow_partial`` accepts a sharded source with shards missing. A manifest
    records its own choice, and a single pack is never a partial anything.
    """
    if isinstance(source, (str, bytes, os.PathLike)):
        path = os.fsdecode(source)
        if is_manifest(path):
            manifest = read_manifest(path)
            return Opened(open_shards(manifest), str(manifest.path), [])
        return Opened([read_index(path)], None, [])
    paths = [os.fsdecode(p) for p in source]
    indexes = [read_index(p) for p in paths]
    return Opened(indexes, None, check_shards(indexes, paths, allow_partial=allow_partial))


def starts_of(packs: Sequence[PackMapping]) -> np.ndarray:
    """int64 (P + 1,): where each pack's records start in the whole, then the total."""
    counts = [p.index.count for p in packs]
    return np.concatenate(([0], np.cumsum(counts, dtype=np.int64))).astype(np.int64)


def locate(starts: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pack, record in that pack) for in-range global indices ``idx``."""
    pack = np.searchsorted(starts, idx, side="right") - 1
    return pack, idx - starts[pack]


def _one(starts: np.ndarray, j: int) -> tuple[int, int]:
    """(pack, record in that pack) of one in-range global index."""
    if len(starts) == 2:
        return 0, j
    p = int(np.searchsorted(starts, j, side="right")) - 1
    return p, j - int(starts[p])


def record(packs: Sequence[PackMapping], starts: np.ndarray, j: int) -> tuple[np.ndarray, Any]:
    """Record ``j`` (in range) as uint8 RGB (h, w, C) at its own size, and its label.

    A raw record is a view of its pack's mapping, copy-on-write: writing to it changes
    only this process's copy of the page, never the file (a copy instead on the
    read-only fallback mapping). A yuv420 record is converted here, on the CPU, by the
    format's own ``yuv420_to_rgb``; a jpeg record decoded (``imgpack.reader.jpeg``).
    """
    p, k = _one(starts, j)
    ix, v = packs[p].index, packs[p].views
    if ix.uniform:
        rec = v.pixels[k]
    else:
        stored, (w, h) = packs[p].stored(k), ix.record_sizes[k].tolist()
        if ix.codec == "yuv420":  # into channel planes, where it converts fastest
            planes = np.empty((ix.channels, h, w), dtype=np.uint8)
            return yuv420_to_rgb(stored, w, h, out=planes.transpose(1, 2, 0)), v.labels[k]
        if ix.codec == "jpeg":
            return decode(stored, w, h, ix.channels, where=where(packs[p], k)), v.labels[k]
        rec = stored.reshape(h, w, ix.channels)
    return (rec if v.writable else rec.copy()), v.labels[k]


def where(pack: PackMapping, k: int) -> str:
    """How an error names record ``k`` of ``pack``: its .bin and the record's number there."""
    return f"{pack.index.data_path} record {k}"


def groups(starts: np.ndarray, idx: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(pack, positions in the batch (ascending), records in the pack) per pack touched."""
    pack, local = locate(starts, idx)
    if (pack == pack[0]).all():
        yield int(pack[0]), np.arange(len(idx)), local
        return
    order = np.argsort(pack, kind="stable")
    for pos in np.split(order, np.flatnonzero(np.diff(pack[order])) + 1):
        yield int(pack[pos[0]]), pos, local[pos]


def copy_records(
    packs: Sequence[PackMapping],
    starts: np.ndarray,
    idx: np.ndarray,
    out_images: np.ndarray,
    out_labels: np.ndarray,
) -> None:
    """Copy records ``idx`` (in range) into (B, H, W, C) ``out_images`` and (B,) ``out_labels``.

    For packs whose records all fill the bound as raw HWC (``PackIndex.uniform``); any
    other batch is copied by ``imgpack.reader.canvas``."""
    # mode="clip" lets numpy write straight into ``out`` (mode="raise" buffers the whole
    # result first: a second copy of the batch); indices were checked already.
    if len(packs) == 1:
        v = packs[0].views
        np.take(v.pixels, idx, axis=0, out=out_images, mode="clip")
        out_labels[...] = v.labels[idx]
        return
    if len(idx) == 0:
        return
    rows = out_images[0].nbytes >= _ROW_COPY_BYTES
    for p, pos, local in groups(starts, idx):
        v = packs[p].views
        out_labels[pos] = v.labels[local]
        lo, hi = int(pos[0]), int(pos[-1]) + 1
        if hi - lo == len(pos):  # a run of the batch: one pack's fast path, in place
            np.take(v.pixels, local, axis=0, out=out_images[lo:hi], mode="clip")
        elif rows:
            px = v.pixels
            for i, k in zip(pos.tolist(), local.tolist()):
                out_images[i] = px[k]
        else:
            out_images[pos] = np.take(v.pixels, local, axis=0, mode="clip")


def stored_run(packs: Sequence[PackMapping], starts: np.ndarray, first: int, stop: int):
    """The stored bytes of records first..stop-1 (in range), end to end: one flat view of
    its mapping per pack the run spans."""
    out = []
    for p in range(len(packs)):
        a, b = max(first, int(starts[p])), min(stop, int(starts[p + 1]))
        if a < b:
            out.append(packs[p].stored(a - int(starts[p]), b - int(starts[p])))
    return out


def will_need(packs: Sequence[PackMapping], starts: np.ndarray, idx: np.ndarray) -> None:
    """MADV_WILLNEED on the pages of records ``idx`` (in range), pack by pack."""
    if len(idx):
        for p, _, local in groups(starts, idx):
            packs[p].will_need(local)


def source_path(packs: Sequence[PackMapping], starts: np.ndarray, j: int) -> str:
    """Record ``j``'s (in range) source file, relative to the folder that was packed."""
    p, k = _one(starts, j)
    return packs[p].source_path(k)
