"""Manifests: the small JSON file that makes many packs (shards) one dataset.

A manifest is a small JSON file written by ``pack-images merge``; no pixel is copied.
It names each shard's ``.bin`` by a path relative to the manifest's own folder
(subfolders and ``..`` allowed, absolute paths refused, so a manifest and its shards
can be moved or mounted elsewhere together), with the shard's ``count``,
``data_file_bytes`` and ``checksums_crc32`` (a CRC-32 of its per-record checksums
section) so that a shard changed or re-packed since the merge is noticed at open. It
also holds what the shards share: the shape, the class names, the packer settings,
and the combined mean/std, derived exactly from the sum of the shards' integer sums.
The dataset's record order is the shards' concatenation, in the manifest's order: the
source order for contiguous shards, not for interleaved ones (``--shard-by``).

Which shards may be combined is decided in ``imgpack.shards``, for both a manifest
and a plain list of packs. This module imports only the standard library, numpy and
``imgpack``'s format modules: the packer (``merge``) and the reader
(``PackedImageDataset``) share it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from imgpack.errors import FormatError
from imgpack.format.index import PackIndex, read_index
from imgpack.format.layout import CHANNEL_COUNTS
from imgpack.shards import SETTINGS_KEYS, check_shards, checksums_crc32, combine_stats
from imgpack.validate import is_count, is_int, is_int_list, is_str_list, load_json

__all__ = ["MANIFEST_FORMAT", "Manifest", "is_manifest", "build_manifest", "read_manifest"]
__all__ += ["open_shards"]

MANIFEST_FORMAT = "imgpack-manifest"
MANIFEST_VERSION = 1  # the only one so far: a reader reads this version, a writer writes it
_SNIFF_BYTES = 4096
_SNIFF = re.compile(rb'"format"\s*:\s*"imgpack-manifest"')


@dataclass(frozen=True)
class ShardEntry:
    """One shard as the manifest recorded it."""

    rel: str  # as written in the manifest, relative to its folder
    path: Path  # the .bin, resolved against the manifest's folder
    count: int
    data_file_bytes: int
    checksums_crc32: int


@dataclass(frozen=True)
class Manifest:
    """A validated manifest (its shards not yet opened: see ``open_shards``)."""

    path: Path
    classes: tuple[str, ...]
    partial: bool
    shards: tuple[ShardEntry, ...]
    raw: dict[str, Any] = field(repr=False)  # count, shape and stats: open_shards checks them


def is_manifest(path: str | os.PathLike) -> bool:
    """True for ``*.manifest.json``, or a .json whose first 4 KiB hold the manifest format."""
    p = Path(path)
    if p.name.endswith(".manifest.json"):
        return True
    if p.suffix != ".json":
        return False
    try:
        with open(p, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError:
        return False
    return _SNIFF.search(head) is not None


# --- writing and reading manifests ----------------------------------------------------


def _relative(bin_path: Path, folder: Path) -> str:
    try:
        rel = os.path.relpath(os.path.abspath(bin_path), os.path.abspath(folder))
    except ValueError:  # another drive on Windows
        raise FormatError(
            f"{bin_path}: cannot be named relative to {folder} (another drive?)"
        ) from None
    return PurePosixPath(*Path(rel).parts).as_posix()


def build_manifest(
    out: str | os.PathLike,
    indexes: Sequence[PackIndex],
    *,
    partial: bool = False,
    shard_crcs: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The manifest for ``indexes`` (already checked) as a dict, paths relative to ``out``."""
    folder = Path(out).parent
    if shard_crcs is None:
        shard_crcs = [checksums_crc32(ix) for ix in indexes]
    ref = indexes[0]
    packer = {k: ref.raw["packer"][k] for k in SETTINGS_KEYS if k in ref.raw["packer"]}
    shards = []
    for ix, crc in zip(indexes, shard_crcs):
        entry = {
            "path": _relative(ix.data_path, folder),
            "count": ix.count,
            "data_file_bytes": ix.data_file_bytes,
            "checksums_crc32": crc,
        }
        if isinstance(ix.raw.get("shard"), dict):
            entry["shard"] = ix.raw["shard"]
        shards.append(entry)
    return {
        "format": MANIFEST_FORMAT,
        "format_version": MANIFEST_VERSION,
        "count": sum(ix.count for ix in indexes),
        "shape": list(ref.shape),
        "codec": ref.codec,
        "classes": list(ref.classes),
        "stats": combine_stats(indexes),
        "packer": packer,
        "partial": bool(partial),
        "shards": shards,
    }


def _parse_shard(entry: Any, folder: Path, name: str, k: int) -> ShardEntry:
    """Shard ``k``'s entry: its counts, and a relative path with no NUL or backslash."""
    keys = ("count", "data_file_bytes", "checksums_crc32")
    if not isinstance(entry, dict) or not all(is_count(entry.get(key)) for key in keys):
        raise FormatError(
            f"{name}: shard {k} should be an object with path, {', '.join(keys)}, found {entry!r}"
        )
    rel = entry.get("path")
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        raise FormatError(f"{name}: shard {k} path {rel!r} is not a relative file path")
    if PurePosixPath(rel).is_absolute() or PureWindowsPath(rel).drive:
        raise FormatError(
            f"{name}: shard {k} path {rel!r} is absolute; manifests name shards relative "
            f"to their own folder so that they can be moved with them"
        )
    return ShardEntry(rel, folder / rel, *(entry[key] for key in keys))


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Parse and validate a manifest (not its shards); raise FormatError on any doubt."""
    path = Path(path)
    name = path.name
    raw = load_json(path, FormatError, what="manifest")
    if raw.get("format") != MANIFEST_FORMAT:
        raise FormatError(f"{name}: format is {raw.get('format')!r}, expected {MANIFEST_FORMAT!r}")
    version = raw.get("format_version")
    if not is_int(version) or version != MANIFEST_VERSION:
        raise FormatError(
            f"{name}: manifest format_version {version!r} is not supported (this imgpack "
            f"reads {MANIFEST_VERSION}); upgrade imgpack"
        )
    shape, classes, shards = raw.get("shape"), raw.get("classes"), raw.get("shards")
    if not is_int_list(shape, 3, minimum=1) or shape[2] not in CHANNEL_COUNTS:
        raise FormatError(f"{name}: shape {shape!r} is not [height, width, 3] (or 1 channel)")
    if not is_str_list(classes):
        raise FormatError(f"{name}: classes should be a list of strings")
    if not (isinstance(shards, list) and shards):
        raise FormatError(f"{name}: shards should be a non-empty list, found {shards!r}")
    if not (is_count(raw.get("count")) and isinstance(raw.get("stats"), dict)):
        raise FormatError(f"{name}: needs an integer count and a stats object")
    if not isinstance(raw.get("partial", False), bool):
        raise FormatError(f"{name}: partial should be true or false")
    entries = tuple(_parse_shard(e, path.parent, name, k) for k, e in enumerate(shards))
    total = sum(e.count for e in entries)
    if total != raw["count"]:
        raise FormatError(f"{name}: shards hold {total} records, count says {raw['count']}")
    return Manifest(path, tuple(classes), raw.get("partial", False), entries, raw)


def open_shards(manifest: Manifest) -> list[PackIndex]:
    """Read every shard's index and check it is still the shard the manifest recorded."""
    name = manifest.path.name
    indexes, shard_crcs = [], []
    for e in manifest.shards:
        try:
            ix = read_index(e.path)
        except FormatError as err:  # missing, unreadable or damaged: say which manifest names it
            raise FormatError(f"{name}: shard {e.rel}: {err}") from None
        now = (ix.count, ix.data_file_bytes, checksums_crc32(ix))
        if now != (e.count, e.data_file_bytes, e.checksums_crc32):
            raise FormatError(
                f"{name}: shard {e.rel} has {ix.count} records, {ix.data_file_bytes} bytes, "
                f"checksums crc {now[2]:08x}; the manifest recorded {e.count}, "
                f"{e.data_file_bytes}, {e.checksums_crc32:08x} (changed since merge? merge again)"
            )
        indexes.append(ix)
        shard_crcs.append(now[2])
    names = [e.rel for e in manifest.shards]
    check_shards(
        indexes,
        names,
        allow_partial=manifest.partial,
        hint="merge every shard",
        shard_crcs=shard_crcs,
    )
    ref = indexes[0]
    if list(ref.shape) != manifest.raw["shape"] or ref.classes != manifest.classes:
        raise FormatError(f"{name}: shape or classes differ from its shards' (edited?)")
    combined = combine_stats(indexes)
    if any(manifest.raw["stats"].get(k) != combined[k] for k in ("pixels", "sum", "sum_sq")):
        raise FormatError(f"{name}: stats differ from the sum of its shards' (edited?)")
    return indexes
