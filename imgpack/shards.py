"""Which packs may be read as one dataset, and their combined stats; shared by merge and reader.

Shards are refused, with the shard named, when their format version, codec (and jpeg
quality), shape (the bound of their records, which may differ in size within it), class
list or pixel-deciding packer settings disagree, when one appears twice (the same
file, the same records, or the same slice of the source listing), and when slices of
a sharded source are missing, unless a partial set is allowed explicitly. Slices come
from the ``shard`` field the packer writes into each index; packs without one (made
by other writers) are only checked for sameness.

Two ways to cut (``"by"`` in the field; absent means contiguous, as in packs written
before interleaving existed): ``contiguous`` shard i of n holds files
[i*T//n, (i+1)*T//n) of the T sorted source files; ``interleaved`` holds files i, i+n,
i+2n, ... Contiguous slices may come from different n as long as they tile the listing;
interleaved shards of one source must share one n, and one source's shards are all cut
the same way (a pack of the whole listing, n = 1, counts as contiguous).

Standard library, numpy and ``imgpack.format`` only: the packer never imports torch.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from typing import Any, NamedTuple

from imgpack.errors import FormatError
from imgpack.format.index import PackIndex
from imgpack.format.write import stats_from_sums
from imgpack.validate import is_int, is_int_list

__all__ = [
    "SETTINGS_KEYS",
    "SHARD_BY",
    "shard_range",
    "shard_slice",
    "checksums_crc32",
    "combine_stats",
    "check_shards",
]

# how a sharded pack cuts the sorted source listing (``--shard-by``); the first is the default
SHARD_BY = ("contiguous", "interleaved")

# packer settings that decide the pixels: always compared (a missing key counts as None)
SETTINGS_KEYS = ("size", "resize", "filter")
# compared only when both shards record them (older or hand-made packs may lack them); the
# packer's codec and channels are not here: the index's own codec and shape are compared
_OPTIONAL_SETTINGS = (
    "labels",
    "draft",
    "reducing_gap",
    "max_pixels",
    "pad_fill",
    "alpha_background",
    "crop_ratio",
)


def shard_range(total: int, num_shards: int, shard_index: int) -> tuple[int, int]:
    """The contiguous slice [start, stop) of the sorted file list that one shard packs."""
    return shard_index * total // num_shards, (shard_index + 1) * total // num_shards


def shard_slice(total: int, num_shards: int, shard_index: int, by: str = SHARD_BY[0]) -> slice:
    """The files of the sorted list that one shard packs: its contiguous range, or, for
    ``interleaved``, every ``num_shards``-th file from ``shard_index`` (every class in each)."""
    if by == "interleaved":
        return slice(shard_index, total, num_shards)
    return slice(*shard_range(total, num_shards, shard_index))


def checksums_crc32(index: PackIndex) -> int:
    """CRC-32 of a pack's per-record checksums section: changes when any record does.

    A manifest records it per shard (``checksums_crc32``) to notice a shard re-packed
    since the merge, and shards with equal ones are refused as copies.
    """
    return zlib.crc32(index.read_section("checksums").tobytes()) & 0xFFFFFFFF


def combine_stats(indexes: Sequence[PackIndex]) -> dict[str, Any]:
    """The stats of (one or more) shards together, exact: add the integer sums, then derive
    mean/std."""
    channels = indexes[0].channels
    pixels, sums, sums_sq = 0, [0] * channels, [0] * channels
    for ix in indexes:
        st = ix.raw["stats"]
        pixels += st["pixels"]
        sums = [a + b for a, b in zip(sums, st["sum"])]
        sums_sq = [a + b for a, b in zip(sums_sq, st["sum_sq"])]
    return stats_from_sums(pixels, sums, sums_sq)


def _target_dim(index: PackIndex) -> int:
    """K of the pack's per-record target vectors; 0 when it has none."""
    f = index.fields.get("targets")
    return f.shape[0] if f is not None else 0


def _classes_differ(ref: tuple[str, ...], got: tuple[str, ...], ref_name: str) -> str:
    if len(ref) != len(got):
        return f"has {len(got)} classes, {ref_name} has {len(ref)}"
    i = next(i for i, (a, b) in enumerate(zip(ref, got)) if a != b)
    return f"class {i} is {got[i]!r}, in {ref_name} it is {ref[i]!r}"


def _settings_differ(ref: dict, got: dict, ref_name: str) -> str | None:
    for key in SETTINGS_KEYS + _OPTIONAL_SETTINGS:
        if key not in SETTINGS_KEYS and (key not in ref or key not in got):
            continue
        if ref.get(key) != got.get(key):
            return f"packer {key} is {got.get(key)!r}, in {ref_name} it is {ref.get(key)!r}"
    return None


class _Cut(NamedTuple):
    """Which files of a sharded source one pack holds, from the packer's ``shard`` field."""

    source: tuple  # (source folder name, source file count): shards of one listing share it
    by: str  # one of SHARD_BY
    index: int
    count: int
    start: int  # contiguous: files [start, stop); interleaved: start = index, stop = total
    stop: int


def _cut(index: PackIndex, name: str) -> _Cut | None:
    """The pack's cut of its source; None when it has no usable ``shard`` field."""
    sh = index.raw.get("shard")
    if not isinstance(sh, dict):
        return None
    i, n, total = sh.get("index"), sh.get("count"), sh.get("source_files")
    if not all(is_int(v) for v in (i, n, total)):
        return None
    if not (n >= 1 and 0 <= i < n and total >= 0):
        return None
    folder = index.raw["packer"].get("source")
    if folder is not None and not isinstance(folder, str):
        raise FormatError(
            f"{name}: packer field 'source' is {folder!r}, expected the source folder's name"
        )
    source = (folder, total)
    by = sh.get("by", SHARD_BY[0])
    if by not in SHARD_BY:
        raise FormatError(
            f"{name}: shard field 'by' is {by!r}, this imgpack knows {', '.join(SHARD_BY)} "
            f"(packed by a newer imgpack?)"
        )
    if by == "interleaved" and n > 1:
        stride = sh.get("source_stride", [i, n])
        if stride != [i, n]:
            raise FormatError(
                f"{name}: shard {i} of {n} holds files {i}, {i + n}, ... of its source, "
                f"its source_stride says {stride!r}"
            )
        return _Cut(source, by, i, n, i, total)
    rng = sh.get("source_range")
    if is_int_list(rng, 2):
        start, stop = rng
    else:  # the packer's rule
        start, stop = shard_range(total, n, i)
    return _Cut(source, "contiguous", i, n, start, stop)  # one shard of 1: the whole listing


def _check_slices(indexes, names, allow_partial: bool, hint: str) -> list[str]:
    """Per sharded source: one way of cutting it, no slice twice or overlapping another,
    and every slice present unless ``allow_partial`` (then what lacks is a warning)."""
    groups: dict[tuple, list[tuple[_Cut, int]]] = {}
    for k, (ix, name) in enumerate(zip(indexes, names)):
        cut = _cut(ix, name)
        if cut is not None:
            groups.setdefault(cut.source, []).append((cut, k))
    warnings = []
    for (source, total), members in groups.items():
        what = f"source {source!r}" if source else "the source"
        (first, k0), seen = members[0], {}
        ordered = sorted(
            members, key=lambda m: (m[0].start, m[0].stop, m[0].index, m[0].count, m[1])
        )
        for cut, k in ordered:
            if cut.by != first.by and 1 in (cut.count, first.count):
                whole = names[k0] if first.count == 1 else names[k]
                raise FormatError(
                    f"{names[k]}: overlaps {names[k0]} in {what}: {whole} holds all "
                    f"{total} files (a whole pack mixed with its shards?)"
                )
            if cut.by != first.by:
                raise FormatError(
                    f"{names[k]}: shard {cut.index} of {cut.count} of {what} is cut --shard-by "
                    f"{cut.by}, {names[k0]} --shard-by {first.by} (merge the shards of one "
                    f"--shard-by)"
                )
            if cut.count != first.count and first.by == "interleaved":
                raise FormatError(
                    f"{names[k]}: shard {cut.index} of {cut.count} of {what}, but {names[k0]} is "
                    f"shard {first.index} of {first.count} (interleaved shards of one dataset "
                    f"need one --num-shards)"
                )
            same = seen.setdefault((cut.index, cut.count), k)
            if same != k:
                raise FormatError(
                    f"{names[k]}: shard {cut.index} of {cut.count} of {what} again "
                    f"({names[same]} is that shard too)"
                )
        for (a, ka), (b, kb) in zip(ordered, ordered[1:]):
            if first.by == "contiguous" and b.start < a.stop:
                raise FormatError(
                    f"{names[kb]}: holds files {b.start}..{b.stop} of {what}, overlapping files "
                    f"{a.start}..{a.stop} in {names[ka]} (shards cut with another --num-shards?)"
                )
        counts = {n for _, n in seen}
        if len(counts) == 1:  # one --num-shards: name the shards that lack
            n = counts.pop()
            missing = sorted(set(range(n)) - {i for i, _ in seen})
            gap = f"shards {', '.join(map(str, missing))} of {n}" if missing else ""
        else:  # contiguous cuts of several counts: only files can be counted
            covered = sum(cut.stop - cut.start for cut, _ in members)
            gap = f"{total - covered} of its {total} files" if covered < total else ""
        if gap and not allow_partial:
            raise FormatError(f"{names[k0]}: {gap} of {what} missing ({hint})")
        if gap:
            warnings.append(f"partial dataset: {gap} of {what} missing")
    return warnings


def check_shards(
    indexes: Sequence[PackIndex],
    names: Sequence[str] | None = None,
    *,
    allow_partial: bool = False,
    hint: str = "pass allow_partial=True to use a partial set",
    shard_crcs: Sequence[int] | None = None,
) -> list[str]:
    """Refuse shards that cannot be one dataset, naming the shard; return warnings.

    ``names`` are how the shards are shown (default: their .bin paths); ``hint`` says
    how to allow missing shards in the caller's terms (a flag or an argument);
    ``shard_crcs`` are the shards' ``checksums_crc32`` when the caller has them already.
    """
    if not indexes:
        raise FormatError("no packs given: a dataset needs at least one shard")
    names = [str(ix.data_path) for ix in indexes] if names is None else list(names)
    if shard_crcs is None:
        shard_crcs = [checksums_crc32(ix) for ix in indexes]
    ref, ref_name = indexes[0], names[0]
    seen_files: dict[tuple[int, int], int] = {}
    seen_records: dict[tuple[int, int, int], int] = {}
    for k, (ix, name, crc) in enumerate(zip(indexes, names, shard_crcs)):
        if ix.raw["format_version"] != ref.raw["format_version"]:
            raise FormatError(
                f"{name}: format_version {ix.raw['format_version']}, "
                f"{ref_name} has {ref.raw['format_version']}"
            )
        if ix.codec != ref.codec:
            raise FormatError(
                f"{name}: records are stored {ix.codec}, in {ref_name} {ref.codec} "
                f"(merge packs of one --codec)"
            )
        if ix.quality != ref.quality:
            raise FormatError(
                f"{name}: records are JPEG at quality {ix.quality}, in {ref_name} at "
                f"{ref.quality} (merge packs of one --quality)"
            )
        if ix.shape != ref.shape:
            h, w, c = ix.shape
            if c != ref.channels:
                raise FormatError(
                    f"{name}: records have {c} channels, in {ref_name} they have {ref.channels}"
                )
            up = "" if ix.uniform and ref.uniform else "up to "  # the bounds differ
            raise FormatError(
                f"{name}: records are {up}{h}x{w}, in {ref_name} they are {up}"
                f"{ref.height}x{ref.width}"
            )
        dim, dim_ref = _target_dim(ix), _target_dim(ref)
        if dim != dim_ref:
            raise FormatError(
                f"{name}: {dim or 'no'} target values per record, {ref_name} has {dim_ref or 'no'}"
            )
        if ix.classes != ref.classes:
            raise FormatError(f"{name}: {_classes_differ(ref.classes, ix.classes, ref_name)}")
        differ = _settings_differ(ref.raw["packer"], ix.raw["packer"], ref_name)
        if differ:
            raise FormatError(f"{name}: {differ}")
        st = os.stat(ix.data_path)
        same = seen_files.setdefault((st.st_dev, st.st_ino), k)
        if same != k:
            raise FormatError(f"{name}: the same file as {names[same]} (a shard given twice)")
        if ix.count:
            key = (ix.count, ix.data_file_bytes, crc)
            same = seen_records.setdefault(key, k)
            if same != k:
                raise FormatError(f"{name}: holds the same records as {names[same]} (a copy?)")
    return _check_slices(indexes, names, allow_partial, hint)
