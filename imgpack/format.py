"""The imgpack on-disk format: the validating index parser, plus the layout it re-exports.

``docs/format.md`` is the prose spec; this module (with ``imgpack.layout``, the
constants and byte layout, and ``imgpack.fields``, the record fields) is its
executable twin, shared by the packer and the reader. Standard library and numpy
only. ``from imgpack.format import ...`` reaches every public name of all three.

Readers must accept every format version ever written (``SUPPORTED_VERSIONS``).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from imgpack import layout
from imgpack.errors import (
    FormatError,
    InconsistentPackError,
    MissingFieldError,
    UnsafePathError,
    UnsupportedVersionError,
)
from imgpack.fields import parse_fields
from imgpack.index import PackIndex
from imgpack.layout import *  # noqa: F403 - the format's public names live on here too
from imgpack.layout import (
    CHANNEL_COUNTS,
    CHANNELS,
    FORMAT_NAME,
    HEADER_BYTES,
    SECTION_ALIGN,
    SECTION_DTYPES,
    SUPPORTED_VERSIONS,
    RecordField,
    Section,
    decode_header,
    layout_sections,
    pack_paths,
)
from imgpack.validate import (
    is_count,
    is_int,
    is_int_list,
    is_number,
    is_str_list,
    load_json,
    require,
    require_count,
)

__all__ = [*layout.__all__, "CHANNELS", "PackIndex", "read_index"]

# field -> accepted JSON types; every one of these is required in version 1 and 2
_REQUIRED = {
    "format": str,
    "format_version": int,
    "data_file": str,
    "data_file_bytes": int,
    "count": int,
    "shape": list,
    "dtype": str,
    "layout": str,
    "record_bytes": int,
    "data_offset": int,
    "classes": list,
    "sections": dict,
    "checksum": dict,
    "stats": dict,
    "skipped": list,
    "packer": dict,
}
# required from version 2 on
_REQUIRED_V2 = {"fields": dict, "pack_id": str}
_PACK_ID = re.compile(r"[0-9a-f]{32}", re.ASCII)


def _field(raw: dict[str, Any], key: str, name: str, kind: type) -> Any:
    if kind is int:
        return require_count(raw, key, name, MissingFieldError, InconsistentPackError)
    return require(raw, key, kind, name, MissingFieldError)


def _parse_sections(raw: dict[str, Any], name: str) -> dict[str, Section]:
    sections = {}
    for sec_name, dtype in SECTION_DTYPES.items():
        entry = raw["sections"].get(sec_name)
        if not isinstance(entry, dict):
            raise MissingFieldError(f"{name}: missing section {sec_name!r}")
        off, nbytes = entry.get("offset"), entry.get("nbytes")
        for v, what in ((off, "offset"), (nbytes, "nbytes")):
            if not is_count(v):
                raise MissingFieldError(f"{name}: section {sec_name!r} has bad {what} {v!r}")
        if entry.get("dtype") != dtype:
            raise InconsistentPackError(
                f"{name}: section {sec_name!r} dtype is {entry.get('dtype')!r}, expected {dtype!r}"
            )
        if nbytes % np.dtype(dtype).itemsize:
            raise InconsistentPackError(
                f"{name}: section {sec_name!r} has {nbytes} bytes, not a whole number of {dtype}"
            )
        sections[sec_name] = Section(off, nbytes, dtype)
    return sections


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a JSON "\ud800" escape
        return False
    return True


def _check_data_file(raw_name: str, json_path: Path, name: str) -> Path:
    """The data file must be a plain name in the index's own folder."""
    pure = Path(raw_name)
    if (
        not raw_name
        or pure.name != raw_name
        or raw_name in (".", "..")
        or "/" in raw_name
        or "\\" in raw_name
        or "\x00" in raw_name
        or not _encodable(raw_name)
    ):
        raise UnsafePathError(
            f"{name}: data_file {raw_name!r} is not a file name in the index's own folder"
        )
    return json_path.parent / raw_name


def _check_shape(raw: dict[str, Any], version: int, name: str) -> tuple[int, int, int]:
    shape = raw["shape"]
    counts = (CHANNELS,) if version == 1 else CHANNEL_COUNTS
    if not is_int_list(shape, 3, minimum=1) or shape[2] not in counts:
        want = "[height, width, 3]" if version == 1 else "[height, width, 1 or 3]"
        raise InconsistentPackError(f"{name}: shape {shape} is not {want}")
    if raw["dtype"] != "uint8" or raw["layout"] != "HWC":
        raise InconsistentPackError(
            f"{name}: dtype/layout {raw['dtype']}/{raw['layout']} unsupported, expected uint8/HWC"
        )
    h, w, c = shape
    if raw["record_bytes"] != h * w * c:
        raise InconsistentPackError(
            f"{name}: record_bytes {raw['record_bytes']} != {h}x{w}x{c} = {h * w * c}"
        )
    return h, w, c


def _check_counts(raw: dict[str, Any], sections: dict[str, Section], name: str) -> None:
    """Every per-record base section has the size that ``count`` implies."""
    count = raw["count"]
    expected = layout_sections(count, raw["record_bytes"], 0)  # the sizes the packer lays out
    for sec_name, want in expected.items():
        nbytes = want.nbytes
        if sec_name != "paths" and sections[sec_name].nbytes != nbytes:
            raise InconsistentPackError(
                f"{name}: section {sec_name!r} has {sections[sec_name].nbytes} bytes, "
                f"{count} records need {nbytes}"
            )


def _check_layout(
    raw: dict[str, Any], sections: dict[str, Section], fields: dict[str, RecordField], name: str
) -> None:
    """Pixels at data_offset, alignment, no overlap, the file ends at the last section."""
    pixels = sections["pixels"]
    if pixels.offset != raw["data_offset"]:
        raise InconsistentPackError(
            f"{name}: pixels start at {pixels.offset}, data_offset says {raw['data_offset']}"
        )
    every = [*sections.items(), *fields.items()]
    for sec_name, s in every:
        if s.offset % SECTION_ALIGN:
            raise InconsistentPackError(
                f"{name}: section {sec_name!r} starts at {s.offset}, "
                f"not a multiple of {SECTION_ALIGN}"
            )
    ordered = sorted(every, key=lambda kv: (kv[1].offset, kv[1].end))
    if ordered[0][1].offset < HEADER_BYTES:
        raise InconsistentPackError(f"{name}: section {ordered[0][0]!r} overlaps the header")
    for (a_name, a), (b_name, b) in zip(ordered, ordered[1:]):
        if a.end > b.offset:
            raise InconsistentPackError(f"{name}: sections {a_name!r} and {b_name!r} overlap")
    end = max(s.end for _, s in ordered)
    if end != raw["data_file_bytes"]:
        raise InconsistentPackError(
            f"{name}: sections end at {end}, data_file_bytes says {raw['data_file_bytes']}"
        )


def read_index(path: str | os.PathLike) -> PackIndex:
    """Parse and validate a pack's index against its .bin; raise FormatError on any doubt.

    ``path`` may name the .json or the .bin. Costs one JSON parse, one header
    read and one pass over the labels section: well under a second for 1M records.
    """
    json_path, asked_bin = pack_paths(path)
    name = json_path.name
    try:
        raw = load_json(
            json_path,
            FormatError,
            what="index",
            missing=f"{json_path}: index not found (a pack is NAME.bin plus NAME.json)",
        )
    except OSError as e:  # a folder, no permission, a name too long: still a one-liner
        raise FormatError(f"{name}: cannot read the index ({e.strerror or e})") from None
    if _field(raw, "format", name, str) != FORMAT_NAME:
        raise FormatError(f"{name}: format is {raw.get('format')!r}, expected {FORMAT_NAME!r}")
    version = _field(raw, "format_version", name, int)
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedVersionError(
            f"{name}: format_version {version} is not supported "
            f"(this imgpack reads {', '.join(map(str, SUPPORTED_VERSIONS))}); upgrade imgpack"
        )
    required = {**_REQUIRED, **(_REQUIRED_V2 if version >= 2 else {})}
    for key, kind in required.items():
        _field(raw, key, name, kind)

    count = raw["count"]
    h, w, c = _check_shape(raw, version, name)
    sections = _parse_sections(raw, name)
    _check_counts(raw, sections, name)
    fields = parse_fields(raw["fields"], count, name) if version >= 2 else {}
    pack_id = raw["pack_id"] if version >= 2 else None  # a required string in version 2
    if pack_id is not None and not _PACK_ID.fullmatch(pack_id):
        raise InconsistentPackError(f"{name}: pack_id {pack_id!r} is not 32 lowercase hex digits")
    _check_layout(raw, sections, fields, name)

    data_path = _check_data_file(raw["data_file"], json_path, name)
    if Path(path).suffix != ".json" and asked_bin.name != data_path.name:
        # Renamed packs: never read another .bin than the one the caller named.
        raise InconsistentPackError(
            f"{name}: index names data file {data_path.name!r}, but {asked_bin.name!r} was opened;"
            f" rename the files back or fix 'data_file'"
        )
    actual = _check_header(raw, data_path, name, version, (h, w, c), pack_id)

    classes = raw["classes"]
    if not is_str_list(classes):
        raise MissingFieldError(f"{name}: classes must be a list of strings")
    if len(set(classes)) != len(classes):
        raise InconsistentPackError(f"{name}: classes {classes} name the same class twice")
    checksum = raw["checksum"]
    if checksum.get("algorithm") != "crc32" or checksum.get("unit") != "record":
        raise InconsistentPackError(
            f"{name}: checksum {checksum} unsupported, expected crc32 per record"
        )
    mean, std = _check_stats(raw["stats"], count * h * w, c, name)

    index = PackIndex(
        json_path=json_path,
        data_path=data_path,
        count=count,
        height=h,
        width=w,
        record_bytes=raw["record_bytes"],
        data_offset=raw["data_offset"],
        data_file_bytes=actual,
        classes=tuple(classes),
        sections=sections,
        mean=tuple(float(x) for x in mean),
        std=tuple(float(x) for x in std),
        raw=raw,
        channels=c,
        pack_id=pack_id,
        fields=fields,
        version=version,
    )
    po = sections["path_offsets"]
    labels, first, last = index.read_ranges(  # one open for both checks
        sections["labels"], Section(po.offset, 8, po.dtype), Section(po.end - 8, 8, po.dtype)
    )
    _check_labels(index, np.frombuffer(labels, dtype=sections["labels"].dtype), name)
    first, last = (int.from_bytes(b, "little") for b in (first, last))
    _check_path_offsets(index, first, last, name)
    return index


def _check_header(raw, data_path: Path, name: str, version: int, shape, pack_id) -> int:
    """The .bin's size and header agree with the index; return its size."""
    h, w, c = shape
    try:
        actual = data_path.stat().st_size
        if actual != raw["data_file_bytes"]:
            raise InconsistentPackError(
                f"{data_path.name}: file has {actual} bytes, index says {raw['data_file_bytes']}"
                + (" (truncated?)" if actual < raw["data_file_bytes"] else "")
            )
        with open(data_path, "rb") as f:
            header = decode_header(f.read(HEADER_BYTES), name=data_path.name)
    except FileNotFoundError:
        raise FormatError(
            f"{name}: data file {data_path.name} not found beside the index"
        ) from None
    except OSError as e:
        raise FormatError(
            f"{name}: cannot read data file {data_path.name} ({e.strerror or e})"
        ) from None
    for key, want in (
        ("format_version", version),
        ("data_offset", raw["data_offset"]),
        ("count", raw["count"]),
        ("record_bytes", raw["record_bytes"]),
        ("height", h),
        ("width", w),
        ("channels", c),
    ):
        if header[key] != want:
            raise InconsistentPackError(
                f"{data_path.name}: header {key} is {header[key]}, index says {want}"
            )
    if version >= 2 and header["pack_id"] != pack_id:
        raise InconsistentPackError(
            f"{data_path.name}: header pack_id is {header['pack_id']}, index says {pack_id}"
            f" (the .bin and the .json are from different packs)"
        )
    return actual


def _check_stats(stats: dict[str, Any], pixels: int, channels: int, name: str):
    """mean/std for the reader, plus the exact sums that let shards be merged."""
    for key, ok in (("mean", is_number), ("std", is_number), ("sum", is_int), ("sum_sq", is_int)):
        v = stats.get(key)
        if not (isinstance(v, list) and len(v) == channels and all(ok(x) for x in v)):
            raise MissingFieldError(
                f"{name}: stats.{key} should be {channels} numbers, found {v!r}"
            )
    if stats.get("pixels") != pixels or isinstance(stats.get("pixels"), bool):
        raise InconsistentPackError(
            f"{name}: stats.pixels is {stats.get('pixels')!r}, count x height x width is {pixels}"
        )
    for key in ("mean", "std"):
        if not all(_finite(x) for x in stats[key]):
            raise InconsistentPackError(f"{name}: stats.{key} {stats[key]} are not finite")
    for c, (total, squares) in enumerate(zip(stats["sum"], stats["sum_sq"])):
        # uint8 values: 0 <= sum <= 255 N and 0 <= sum_sq <= 255 sum
        if not (0 <= total <= 255 * pixels and 0 <= squares <= 255 * total):
            raise InconsistentPackError(
                f"{name}: stats.sum/sum_sq of channel {c} ({total}, {squares}) are not sums "
                f"of {pixels} uint8 values"
            )
    return stats["mean"], stats["std"]


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False


def _check_labels(index: PackIndex, labels: np.ndarray, name: str) -> None:
    """Every label is -1 (unlabelled pack) or a valid class index."""
    if index.count == 0:
        return
    lo, hi = int(labels.min()), int(labels.max())
    n = len(index.classes)
    if n == 0 and (lo, hi) != (-1, -1):
        raise InconsistentPackError(f"{name}: pack has no classes but labels span {lo}..{hi}")
    if n and (lo < 0 or hi >= n):
        bad = int(np.flatnonzero((labels < 0) | (labels >= n))[0])
        raise InconsistentPackError(
            f"{name}: record {bad} has label {int(labels[bad])}, expected 0..{n - 1} ({n} classes)"
        )


def _check_path_offsets(index: PackIndex, first: int, last: int, name: str) -> None:
    """The path offsets (``first`` and ``last`` of them) run from 0 to the paths' size."""
    paths = index.sections["paths"].nbytes
    if first != 0 or last != paths:
        raise InconsistentPackError(
            f"{name}: path offsets run {first}..{last}, the paths section has {paths} bytes"
        )
