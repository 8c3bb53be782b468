"""Which packs may be read as one dataset, and their combined stats; shared by merge and reader.

Shards are refused, with the shard named, when their format version, shape, class
list or pixel-deciding packer settings disagree, when one appears twice (the same
file, the same records, or the same slice of the source listing), and when slices of
a sharded source are missing, unless a partial set is allowed explicitly. Slices come
from the ``shard`` field the packer writes into each index; packs without one (made
by other writers) are only checked for sameness.

Standard library, numpy and ``imgpack.format`` only: the packer never imports torch.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from typing import Any

from imgpack.errors import ShardMismatchError
from imgpack.format import PackIndex, stats_from_sums

__all__ = ["SETTINGS_KEYS", "fingerprint", "combine_stats", "check_shards"]

# packer settings that decide the pixels: always compared (a missing key counts as None)
SETTINGS_KEYS = ("size", "resize", "filter")
# compared only when both shards record them (older or hand-made packs may lack them)
_OPTIONAL_SETTINGS = (
    "labels",
    "draft",
    "reducing_gap",
    "max_pixels",
    "pad_fill",
    "alpha_background",
)


def fingerprint(index: PackIndex) -> int:
    """CRC-32 of a pack's per-record checksums section: changes when any record does."""
    return zlib.crc32(index.read_section("checksums").tobytes()) & 0xFFFFFFFF


def combine_stats(indexes: Sequence[PackIndex]) -> dict[str, Any]:
    """The stats of all shards together, exact: add the integer sums, then derive mean/std."""
    pixels, sums, sums_sq = 0, [0, 0, 0], [0, 0, 0]
    for ix in indexes:
        st = ix.raw["stats"]
        pixels += st["pixels"]
        sums = [a + b for a, b in zip(sums, st["sum"])]
        sums_sq = [a + b for a, b in zip(sums_sq, st["sum_sq"])]
    return stats_from_sums(pixels, sums, sums_sq)


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


def _slice(index: PackIndex) -> tuple[tuple, int, int, int, int] | None:
    """(source key, start, stop, shard index, shard count) from the packer's ``shard`` field."""
    sh = index.raw.get("shard")
    if not isinstance(sh, dict):
        return None
    i, n, total = sh.get("index"), sh.get("count"), sh.get("source_files")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (i, n, total)):
        return None
    if not (n >= 1 and 0 <= i < n and total >= 0):
        return None
    rng = sh.get("source_range")
    if isinstance(rng, list) and len(rng) == 2 and all(isinstance(v, int) for v in rng):
        start, stop = rng
    else:  # the packer's rule: shard i holds files [i*total//n, (i+1)*total//n)
        start, stop = i * total // n, (i + 1) * total // n
    return (index.raw["packer"].get("source"), total), start, stop, i, n


def _check_slices(indexes, names, allow_partial: bool, hint: str) -> list[str]:
    """No slice of a sharded source twice; every slice present unless allowed."""
    groups: dict[tuple, list] = {}
    for k, ix in enumerate(indexes):
        s = _slice(ix)
        if s is not None:
            groups.setdefault(s[0], []).append((s[1], s[2], s[3], s[4], k))
    warnings = []
    for (source, total), members in groups.items():
        members.sort()
        what = f"source {source!r}" if source else "the source"
        for (a0, a1, ai, an, ka), (b0, b1, bi, bn, kb) in zip(members, members[1:]):
            if (ai, an) == (bi, bn):
                raise ShardMismatchError(
                    f"{names[kb]}: shard {bi} of {bn} of {what} again "
                    f"({names[ka]} is that shard too)"
                )
            if b0 < a1:
                raise ShardMismatchError(
                    f"{names[kb]}: holds files {b0}..{b1} of {what}, overlapping files "
                    f"{a0}..{a1} in {names[ka]} (shards cut with another --num-shards?)"
                )
        counts = {m[3] for m in members}
        if len(counts) == 1:
            n = counts.pop()
            missing = sorted(set(range(n)) - {m[2] for m in members})
            gap = f"shards {', '.join(map(str, missing))} of {n}" if missing else ""
        else:
            covered = sum(m[1] - m[0] for m in members)
            gap = f"{total - covered} of its {total} files" if covered < total else ""
        if gap:
            msg = f"{gap} of {what} missing"
            if not allow_partial:
                raise ShardMismatchError(f"{names[members[0][4]]}: {msg} ({hint})")
            warnings.append(f"partial dataset: {msg}")
    return warnings


def check_shards(
    indexes: Sequence[PackIndex],
    names: Sequence[str] | None = None,
    *,
    allow_partial: bool = False,
    hint: str = "pass allow_partial=True to use a partial set",
    prints: Sequence[int] | None = None,
) -> list[str]:
    """Refuse shards that cannot be one dataset, naming the shard; return warnings.

    ``names`` are how the shards are shown (default: their .bin paths); ``hint`` says
    how to allow missing shards in the caller's terms (a flag or an argument);
    ``prints`` are the shards' ``fingerprint``s when the caller has them already.
    """
    if not indexes:
        raise ShardMismatchError("no packs given: a dataset needs at least one shard")
    names = [str(ix.data_path) for ix in indexes] if names is None else list(names)
    prints = [fingerprint(ix) for ix in indexes] if prints is None else prints
    ref, ref_name = indexes[0], names[0]
    seen_files: dict[tuple[int, int], int] = {}
    seen_records: dict[tuple[int, int, int], int] = {}
    for k, (ix, name, crc) in enumerate(zip(indexes, names, prints)):
        if ix.raw["format_version"] != ref.raw["format_version"]:
            raise ShardMismatchError(
                f"{name}: format_version {ix.raw['format_version']}, "
                f"{ref_name} has {ref.raw['format_version']}"
            )
        if ix.shape != ref.shape:
            h, w, _ = ix.shape
            raise ShardMismatchError(
                f"{name}: records are {h}x{w}, in {ref_name} they are {ref.height}x{ref.width}"
            )
        if ix.classes != ref.classes:
            raise ShardMismatchError(
                f"{name}: {_classes_differ(ref.classes, ix.classes, ref_name)}"
            )
        differ = _settings_differ(ref.raw["packer"], ix.raw["packer"], ref_name)
        if differ:
            raise ShardMismatchError(f"{name}: {differ}")
        st = os.stat(ix.data_path)
        same = seen_files.setdefault((st.st_dev, st.st_ino), k)
        if same != k:
            raise ShardMismatchError(
                f"{name}: the same file as {names[same]} (a shard given twice)"
            )
        if ix.count:
            key = (ix.count, ix.data_file_bytes, crc)
            same = seen_records.setdefault(key, k)
            if same != k:
                raise ShardMismatchError(
                    f"{name}: holds the same records as {names[same]} (a copy?)"
                )
    return _check_slices(indexes, names, allow_partial, hint)
