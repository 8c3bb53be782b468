"""Many packs read as one dataset: which shards belong together, and the manifest naming them.

Shards are refused, with the shard named, when their format version, codec (and jpeg
quality), shape (the bound of their records, which may differ in size within it), class
list or pixel-deciding packer settings disagree, when one appears twice (the same
pack id: the same file or a copy of it; or the same slice of the source listing), and
when slices of a sharded source are missing, unless a partial set is allowed explicitly (a
manifest missing one is refused naming the manifest: it is what is out of date). Slices come
from the ``shard`` field the packer writes into each index; packs without one (made
by other writers) are only checked for sameness. ``pack-images merge`` and
``PackedImageDataset`` (given a list of packs or a manifest) both ask ``check_shards``.

Two ways to cut (``"by"`` in the field; absent means contiguous, as in packs written
before interleaving existed): ``contiguous`` shard i of n holds files
[i*T//n, (i+1)*T//n) of the T sorted source files; ``interleaved`` holds files i, i+n,
i+2n, ... Contiguous slices may come from different n as long as they tile the listing;
interleaved shards of one source must share one n, and one source's shards are all cut
the same way (a pack of the whole listing, n = 1, counts as contiguous).

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

Standard library, numpy and ``imgpack.format`` only: the packer never imports torch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, NamedTuple

from imgpack.errors import FormatError
from imgpack.format.index import PackIndex, read_index
from imgpack.format.write import record_checksum, stats_from_sums
from imgpack.validate import check_rules, is_count, is_int, is_str_list, load_json, stated

__all__ = [
    "SHARD_BY",
    "shard_slice",
    "combine_stats",
    "check_shards",
    "MANIFEST_FORMAT",
    "is_manifest",
    "build_manifest",
    "read_manifest",
    "open_shards",
]

# how a sharded pack cuts the sorted source listing (``--shard-by``); the first is the default
SHARD_BY = ("contiguous", "interleaved")

# packer settings that decide the pixels: always compared (a missing key counts as None),
# and kept in a manifest
_SETTINGS = ("size", "resize", "filter")
# compared only when both shards record them (older or hand-made packs may lack them); the
# packer's codec and channels are not here: the index's own codec and shape are compared
_OPTIONAL = "labels draft reducing_gap max_pixels pad_fill alpha_background crop_ratio".split()

MANIFEST_FORMAT = "imgpack-manifest"
MANIFEST_VERSION = 1  # the only one so far: a reader reads this version, a writer writes it
_SNIFF = re.compile(rb'"format"\s*:\s*"imgpack-manifest"')  # sought in a .json's first 4 KiB
# what a manifest records of each shard besides its path: a shard changed since is refused
_RECORDED = ("count", "data_file_bytes", "checksums_crc32")


def shard_slice(total: int, num_shards: int, shard_index: int, by: str = SHARD_BY[0]) -> slice:
    """The files of the sorted list that one shard packs: files [i*T//n, (i+1)*T//n) for
    ``contiguous``, or, for ``interleaved``, every ``num_shards``-th file from ``shard_index``
    (every class in each). The one rule: the packer cuts with it, and the shard check
    derives each shard's files from it (never from the ``source_range`` or
    ``source_stride`` the packer also writes)."""
    if by == "interleaved":
        return slice(shard_index, total, num_shards)
    return slice(shard_index * total // num_shards, (shard_index + 1) * total // num_shards)


def _recorded(index: PackIndex) -> dict[str, int]:
    """What a manifest records of a shard (``_RECORDED``), as the shard is now. Its
    ``checksums_crc32``, a CRC-32 of the per-record checksums section, changes when any
    record does: a shard re-packed since the merge is noticed (a copy given twice is told
    by its pack id, ``check_shards``)."""
    crc = record_checksum(index.read_section("checksums"))  # the CRC-32 the records use
    return dict(zip(_RECORDED, (index.count, index.data_file_bytes, crc)))


def combine_stats(indexes: Sequence[PackIndex]) -> dict[str, Any]:
    """The stats of (one or more) shards together, exact: add the integer sums, then derive
    mean/std."""
    stats = [ix.raw["stats"] for ix in indexes]
    sums = [sum(column) for column in zip(*(st["sum"] for st in stats))]
    squares = [sum(column) for column in zip(*(st["sum_sq"] for st in stats))]
    return stats_from_sums(sum(st["pixels"] for st in stats), sums, squares)


# --- which packs may be one dataset ---------------------------------------------------------


_QUALITY = "records are JPEG at quality {}, in {ref} at {} (merge packs of one --quality)"


def _mismatch(ix: PackIndex, ref: PackIndex, ref_name: str) -> str | None:
    """Why ``ix`` cannot be read as one dataset with ``ref``, in words; None when it can."""
    up = "" if ix.uniform and ref.uniform else "up to "  # the bounds differ
    sizes = [f"{up}{x.height}x{x.width}" for x in (ix, ref)]
    dims = [f"{x.fields['targets'].shape[0]}" if "targets" in x.fields else "no" for x in (ix, ref)]
    first = next((k for k, (a, b) in enumerate(zip(ix.classes, ref.classes)) if a != b), 0)
    names = [repr(x.classes[first]) if x.classes else "" for x in (ix, ref)]
    # (this pack's, the reference's, the words): the first that differs is the reason
    for mine, theirs, words in (
        (ix.raw["format_version"], ref.raw["format_version"], "format_version {}, {ref} has {}"),
        (ix.codec, ref.codec, "records are stored {}, in {ref} {} (merge packs of one --codec)"),
        (ix.quality, ref.quality, _QUALITY),
        (ix.channels, ref.channels, "records have {} channels, in {ref} they have {}"),
        (*sizes, "records are {}, in {ref} they are {}"),
        (*dims, "{} target values per record, {ref} has {}"),
        (len(ix.classes), len(ref.classes), "has {} classes, {ref} has {}"),
        (*names, f"class {first} is {{}}, in {{ref}} it is {{}}"),
    ):
        if mine != theirs:
            return words.format(mine, theirs, ref=ref_name)
    got, want = ix.raw["packer"], ref.raw["packer"]
    for key in (*_SETTINGS, *_OPTIONAL):
        if (key in _SETTINGS or key in got and key in want) and got.get(key) != want.get(key):
            return f"packer {key} is {got.get(key)!r}, in {ref_name} it is {want.get(key)!r}"
    return None


class _Cut(NamedTuple):
    """Which files of a sharded source one pack holds, from the packer's ``shard`` field."""

    source: tuple  # (source folder name, source file count): shards of one listing share it
    index: int
    count: int
    files: range  # the indices, in the sorted source listing, of the files it holds


_NEWER_BY = f"one of {', '.join(SHARD_BY)} (packed by a newer imgpack?)"
_BY = [("by", lambda v: v is None or v in SHARD_BY, _NEWER_BY)]  # absent: contiguous
_SOURCE = [("source", lambda v: v is None or isinstance(v, str), "the source folder's name")]


def _cut(index: PackIndex, name: str) -> _Cut | None:
    """The pack's cut of its source; None when it has no usable ``shard`` field."""
    sh = index.raw.get("shard")
    sh = sh if isinstance(sh, dict) else {}
    i, n, total = sh.get("index"), sh.get("count"), sh.get("source_files")
    if not (all(is_int(v) for v in (i, n, total)) and 0 <= i < n and total >= 0):
        return None
    check_rules(index.raw["packer"], _SOURCE, f"{name}: packer.")
    check_rules(sh, _BY, f"{name}: shard.")
    # what the packer cut: its source_range or source_stride says it too, and is not read
    files = range(total)[shard_slice(total, n, i, sh.get("by") or SHARD_BY[0])]
    return _Cut((index.raw["packer"].get("source"), total), i, n, files)


def _files(cut: _Cut) -> str:
    """A cut's files in words: a run of the listing, or an interleaved shard."""
    if cut.files.step == 1:
        return f"files {cut.files.start}..{cut.files.stop}"
    return f"shard {cut.index} of {cut.count} --shard-by interleaved"


def _check_slices(indexes, names, allow_partial: bool, hint: str, where: str | None) -> list[str]:
    """Per sharded source: its shards tile the listing, and every file is in one unless
    ``allow_partial`` (then what lacks is a warning).

    One rule: in the order of their first file, each shard's files are a range with the
    step of the one before (1 contiguous, n interleaved: one way of cutting, one n for
    interleaved shards) that starts where that one's files end or on another residue
    (no file twice)."""
    groups: dict[tuple, list[tuple[_Cut, str]]] = {}
    for ix, name in zip(indexes, names):
        cut = _cut(ix, name)
        if cut is not None:
            groups.setdefault(cut.source, []).append((cut, name))
    warnings = []
    for (source, total), members in groups.items():
        what = f"source {source!r}" if source else "the source"
        ordered = sorted(members, key=lambda m: (m[0].files.start, m[0].files.stop))
        for (a, a_name), (b, b_name) in zip(ordered, ordered[1:]):
            step, start = a.files.step, b.files.start
            if b.files.step != step:
                why = "cut another way than"
            elif start < a.files.stop and (start - a.files.start) % step == 0:
                why = "overlapping"
            else:
                continue
            raise FormatError(
                f"{b_name}: holds {_files(b)} of {what}, {why} {_files(a)} in {a_name} (merge "
                f"each shard once, cut with one --shard-by; interleaved: one --num-shards)"
            )
        counts = {cut.count for cut, _ in members}
        if len(counts) == 1:  # one --num-shards: name the shards that lack
            n = counts.pop()
            missing = sorted(set(range(n)) - {cut.index for cut, _ in members})
            gap = f"shards {', '.join(map(str, missing))} of {n}" if missing else ""
        else:  # contiguous cuts of several counts: only files can be counted
            covered = sum(len(cut.files) for cut, _ in members)
            gap = f"{total - covered} of its {total} files" if covered < total else ""
        if gap and not allow_partial:
            raise FormatError(f"{where or members[0][1]}: {gap} of {what} missing ({hint})")
        if gap:
            warnings.append(f"partial dataset: {gap} of {what} missing")
    return warnings


def check_shards(
    indexes: Sequence[PackIndex],
    names: Sequence[str] | None = None,
    *,
    allow_partial: bool = False,
    hint: str = "pass allow_partial=True to use a partial set",
    where: str | None = None,
) -> list[str]:
    """Refuse shards that cannot be one dataset, naming the shard; return warnings.

    ``names`` are how the shards are shown (default: their .bin paths); ``hint`` says
    how to allow missing shards in the caller's terms (a flag or an argument), ``where``
    the file a missing shard is told against (a manifest; default: the first shard). A shard
    given twice, by one path or two, or a copy of it, is told by its pack id, which names
    what its records are.
    """
    if not indexes:
        raise FormatError("no packs given: a dataset needs at least one shard")
    names = [str(ix.data_path) for ix in indexes] if names is None else list(names)
    seen: dict[str, int] = {}  # the pack id: what the records are
    for k, (ix, name) in enumerate(zip(indexes, names)):
        why = _mismatch(ix, indexes[0], names[0])
        if why is not None:
            raise FormatError(f"{name}: {why}")
        # empty packs of one dataset share an id, and add nothing twice
        same = seen.setdefault(ix.pack_id, k) if ix.count else k
        if same != k:
            raise FormatError(
                f"{name}: holds the same records as {names[same]} (a shard given twice, or a copy)"
            )
    return _check_slices(indexes, names, allow_partial, hint, where)


# --- manifests -------------------------------------------------------------------------------


def is_manifest(path: str | os.PathLike) -> bool:
    """True for ``*.manifest.json``, or a .json whose first 4 KiB hold the manifest format."""
    p = Path(path)
    if p.name.endswith(".manifest.json"):
        return True
    if p.suffix != ".json":
        return False
    try:
        with open(p, "rb") as f:
            return _SNIFF.search(f.read(4096)) is not None
    except OSError:
        return False


def build_manifest(
    out: str | os.PathLike, indexes: Sequence[PackIndex], *, partial: bool = False
) -> dict[str, Any]:
    """The manifest for ``indexes`` (already checked) as a dict, paths relative to ``out``."""
    folder = os.path.abspath(Path(out).parent)
    shards = []
    for ix in indexes:  # as_posix: "/" between the parts, whatever this system's separator
        rel = Path(os.path.relpath(os.path.abspath(ix.data_path), folder)).as_posix()
        cut = {"shard": ix.raw["shard"]} if isinstance(ix.raw.get("shard"), dict) else {}
        shards.append({"path": rel, **_recorded(ix), **cut})
    return {
        "format": MANIFEST_FORMAT,
        "format_version": MANIFEST_VERSION,
        **_derived(indexes),
        "partial": bool(partial),
        "shards": shards,
    }


def _derived(indexes: Sequence[PackIndex]) -> dict[str, Any]:
    """What a manifest states of its shards together: derived from them when it is written,
    and again when it is opened, to notice an edit."""
    ref = indexes[0]
    return {
        "count": sum(ix.count for ix in indexes),
        "shape": list(ref.shape),
        "codec": ref.codec,
        "classes": list(ref.classes),
        "stats": combine_stats(indexes),
        "packer": {k: ref.raw["packer"][k] for k in _SETTINGS if k in ref.raw["packer"]},
    }


def _relative(rel: Any) -> bool:
    """A relative file path: a non-empty string, no NUL or backslash, no root or drive."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        return False
    return not (PurePosixPath(rel).is_absolute() or PureWindowsPath(rel).drive)


# a manifest's own fields, and each shard's entry: (key, test, what it expects)
_READS = f"{MANIFEST_VERSION}, the version this imgpack reads (a newer one: upgrade imgpack)"
_MANIFEST = [
    ("format", lambda v: v == MANIFEST_FORMAT, repr(MANIFEST_FORMAT)),
    ("format_version", lambda v: is_int(v) and v == MANIFEST_VERSION, _READS),
    ("classes", is_str_list, "a list of strings"),
    ("shards", lambda v: isinstance(v, list) and len(v) > 0, "a non-empty list"),
    ("partial", lambda v: v is None or isinstance(v, bool), "true or false"),
    ("stats", lambda v: isinstance(v, dict), "the shards' stats object (edited? merge again)"),
]
_ENTRY = [
    *[(key, is_count, "an int >= 0") for key in _RECORDED],
    # relative to the manifest's own folder, so that a manifest and its shards move together
    ("path", _relative, "a file path relative to the manifest's folder"),
]


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """Parse and validate a manifest's own fields: what names its shards, the class names
    (``pack-images --classes-from`` reads no more), whether it is partial. What the shards
    determine (count, shape, stats) is checked against them when they are opened
    (``open_shards``); raise FormatError on any doubt. Returns the manifest as read."""
    name = Path(path).name
    raw = load_json(path, what="manifest")
    check_rules(raw, _MANIFEST, f"{name}: ")
    for k, entry in enumerate(raw["shards"]):
        if not isinstance(entry, dict):
            raise FormatError(f"{name}: shard {k} is {entry!r}, expected an object")
        check_rules(entry, _ENTRY, f"{name}: shard {k} ")
    return raw


def _check_same(said: dict[str, Any], made: dict[str, Any], where: str, why: str) -> None:
    """FormatError for the first of ``made``'s figures that ``said`` states otherwise; ``why``
    shows the figure made (``{!r}``) and says what a difference means."""
    for key, value in made.items():
        if said.get(key) != value:
            raise FormatError(f"{where}{key} is {stated(said, key)}, {why.format(value)}")


def open_shards(path: str | os.PathLike) -> list[PackIndex]:
    """Read the manifest at ``path`` and every shard's index; check each is still the shard
    the manifest recorded, and that what the manifest states of them together is what they
    make."""
    raw, name = read_manifest(path), Path(path).name
    rels, indexes = [entry["path"] for entry in raw["shards"]], []
    for rel, entry in zip(rels, raw["shards"]):
        try:
            ix = read_index(Path(path).parent / rel)
        except FormatError as err:  # missing, unreadable or damaged: say which manifest names it
            raise FormatError(f"{name}: shard {rel}: {err}") from None
        why = "the shard has {!r} now (changed since merge? merge again)"
        _check_same(entry, _recorded(ix), f"{name}: shard {rel} ", why)
        indexes.append(ix)
    # a shard entry deleted by hand: the manifest is what is out of date
    partial = raw.get("partial", False)
    check_shards(indexes, rels, allow_partial=partial, hint="edited? merge again", where=name)
    made, why = _derived(indexes), "its shards make {!r} (edited? merge again)"
    _check_same(raw, {k: made[k] for k in ("count", "shape", "codec", "classes")}, f"{name}: ", why)
    # each of the stats apart: the figure that differs, not both stats objects whole
    _check_same(raw["stats"], made["stats"], f"{name}: stats ", why)
    return indexes
