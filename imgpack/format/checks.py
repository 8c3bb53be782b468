"""The rules a pack index must pass before anything trusts it, one function per rule.

``imgpack.format.index.read_index`` applies them in the order ``docs/format.md``
lists under "Rules for readers"; each raises the ``FormatError`` subclass the
spec names, with a message that starts with the file's name. They judge values
already read (the raw JSON, the sections, a few numbers from the .bin) and never
open a file, so each rule can be read, and tested, on its own. Standard library
and numpy only.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.errors import FormatError
from imgpack.format.layout import (
    CHANNEL_COUNTS,
    FORMAT_NAME,
    HEADER_BYTES,
    PRE_RELEASE_VERSIONS,
    SECTION_ALIGN,
    SECTION_DTYPES,
    SUPPORTED_VERSIONS,
    RecordField,
    Section,
    layout_sections,
)
from imgpack.validate import (
    is_count,
    is_int,
    is_int_list,
    is_number,
    is_str_list,
    require,
    require_count,
)

__all__ = [
    "check_version",
    "check_shape",
    "parse_sections",
    "check_counts",
    "check_pack_id",
    "check_layout",
    "check_data_file",
    "check_classes",
    "check_checksum",
    "check_stats",
    "check_labels",
    "check_path_offsets",
]

# field -> accepted JSON type; every one of these is required (the jpeg object of a jpeg
# pack is checked with the codec, imgpack.format.records.check_jpeg)
_REQUIRED = {
    "format": str,
    "format_version": int,
    "data_file": str,
    "data_file_bytes": int,
    "count": int,
    "shape": list,
    "dtype": str,
    "layout": str,
    "codec": str,
    "data_offset": int,
    "classes": list,
    "sections": dict,
    "fields": dict,
    "pack_id": str,
    "checksum": dict,
    "stats": dict,
    "skipped": list,
    "packer": dict,
}
_PACK_ID = re.compile(r"[0-9a-f]{32}", re.ASCII)


def _field(raw: dict[str, Any], key: str, name: str, kind: type) -> Any:
    if kind is int:
        return require_count(raw, key, name, FormatError)
    return require(raw, key, kind, name, FormatError)


def check_version(raw: dict[str, Any], name: str) -> int:
    """An imgpack index of a version this imgpack reads, with every field it requires.

    The version is checked before any other field: other versions may have other fields.
    A pre-release version (never shipped, no longer read) is refused with what to do.
    """
    if _field(raw, "format", name, str) != FORMAT_NAME:
        raise FormatError(f"{name}: format is {raw.get('format')!r}, expected {FORMAT_NAME!r}")
    version = _field(raw, "format_version", name, int)
    if version in PRE_RELEASE_VERSIONS:
        raise FormatError(
            f"{name}: format version {version} was a pre-release format; repack it with pack-images"
        )
    if version not in SUPPORTED_VERSIONS:
        raise FormatError(
            f"{name}: format_version {version} is not supported "
            f"(this imgpack reads {', '.join(map(str, SUPPORTED_VERSIONS))}); upgrade imgpack"
        )
    for key, kind in _REQUIRED.items():
        _field(raw, key, name, kind)
    return version


def parse_sections(raw: dict[str, Any], name: str) -> dict[str, Section]:
    """The five base sections, each with its standard dtype and a whole number of elements."""
    sections = {}
    for sec_name, dtype in SECTION_DTYPES.items():
        entry = raw["sections"].get(sec_name)
        if not isinstance(entry, dict):
            raise FormatError(f"{name}: missing section {sec_name!r}")
        off, nbytes = entry.get("offset"), entry.get("nbytes")
        for v, what in ((off, "offset"), (nbytes, "nbytes")):
            if not is_count(v):
                raise FormatError(f"{name}: section {sec_name!r} has bad {what} {v!r}")
        if entry.get("dtype") != dtype:
            raise FormatError(
                f"{name}: section {sec_name!r} dtype is {entry.get('dtype')!r}, expected {dtype!r}"
            )
        if nbytes % np.dtype(dtype).itemsize:
            raise FormatError(
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


def check_data_file(raw_name: str, json_path: Path, name: str) -> Path:
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
        raise FormatError(
            f"{name}: data_file {raw_name!r} is not a file name in the index's own folder"
        )
    return json_path.parent / raw_name


def check_shape(raw: dict[str, Any], name: str) -> tuple[int, int, int]:
    """(height, width, channels): the bound of uint8 HWC records, 1 or 3 channels."""
    shape = raw["shape"]
    if not is_int_list(shape, 3, minimum=1) or shape[2] not in CHANNEL_COUNTS:
        raise FormatError(f"{name}: shape {shape} is not [height, width, 1 or 3]")
    if raw["dtype"] != "uint8" or raw["layout"] != "HWC":
        raise FormatError(
            f"{name}: dtype/layout {raw['dtype']}/{raw['layout']} unsupported, expected uint8/HWC"
        )
    h, w, c = shape
    return h, w, c


def check_counts(raw: dict[str, Any], sections: dict[str, Section], name: str) -> None:
    """Every per-record base section but the pixels has the size that ``count`` implies
    (the pixels' size follows from the record sizes: ``check_record_sizes``)."""
    count = raw["count"]
    expected = layout_sections(count, sections["pixels"].nbytes, 0)  # the packer's sizes
    for sec_name, want in expected.items():
        nbytes = want.nbytes
        if sec_name not in ("pixels", "paths") and sections[sec_name].nbytes != nbytes:
            raise FormatError(
                f"{name}: section {sec_name!r} has {sections[sec_name].nbytes} bytes, "
                f"{count} records need {nbytes}"
            )


def check_pack_id(raw: dict[str, Any], name: str) -> str:
    """The pack id: 32 lowercase hex digits."""
    pack_id = raw["pack_id"]  # a required string (check_version)
    if not _PACK_ID.fullmatch(pack_id):
        raise FormatError(f"{name}: pack_id {pack_id!r} is not 32 lowercase hex digits")
    return pack_id


def check_layout(
    raw: dict[str, Any], sections: dict[str, Section], fields: dict[str, RecordField], name: str
) -> None:
    """Pixels at data_offset, alignment, no overlap, the file ends at the last section."""
    pixels = sections["pixels"]
    if pixels.offset != raw["data_offset"]:
        raise FormatError(
            f"{name}: pixels start at {pixels.offset}, data_offset says {raw['data_offset']}"
        )
    every = [*sections.items(), *fields.items()]
    for sec_name, s in every:
        if s.offset % SECTION_ALIGN:
            raise FormatError(
                f"{name}: section {sec_name!r} starts at {s.offset}, "
                f"not a multiple of {SECTION_ALIGN}"
            )
    ordered = sorted(every, key=lambda kv: (kv[1].offset, kv[1].end))
    if ordered[0][1].offset < HEADER_BYTES:
        raise FormatError(f"{name}: section {ordered[0][0]!r} overlaps the header")
    for (a_name, a), (b_name, b) in zip(ordered, ordered[1:]):
        if a.end > b.offset:
            raise FormatError(f"{name}: sections {a_name!r} and {b_name!r} overlap")
    end = max(s.end for _, s in ordered)
    if end != raw["data_file_bytes"]:
        raise FormatError(
            f"{name}: sections end at {end}, data_file_bytes says {raw['data_file_bytes']}"
        )


def check_classes(classes: Any, name: str) -> None:
    """Distinct class names: label k means ``classes[k]``."""
    if not is_str_list(classes):
        raise FormatError(f"{name}: classes must be a list of strings")
    if len(set(classes)) != len(classes):
        raise FormatError(f"{name}: classes {classes} name the same class twice")


def check_checksum(checksum: dict[str, Any], name: str) -> None:
    """The checksums section holds what this imgpack verifies: a CRC-32 per record."""
    if checksum.get("algorithm") != "crc32" or checksum.get("unit") != "record":
        raise FormatError(f"{name}: checksum {checksum} unsupported, expected crc32 per record")


def check_stats(stats: dict[str, Any], pixels: int, channels: int, name: str):
    """mean/std for the reader, plus the exact sums that let shards be merged.

    ``pixels`` is how many pixels (per channel) the records hold: the sum of their
    width x height."""
    for key, ok in (("mean", is_number), ("std", is_number), ("sum", is_int), ("sum_sq", is_int)):
        v = stats.get(key)
        if not (isinstance(v, list) and len(v) == channels and all(ok(x) for x in v)):
            raise FormatError(f"{name}: stats.{key} should be {channels} numbers, found {v!r}")
    if stats.get("pixels") != pixels or isinstance(stats.get("pixels"), bool):
        raise FormatError(
            f"{name}: stats.pixels is {stats.get('pixels')!r}, "
            f"the records' width x height is {pixels}"
        )
    for key in ("mean", "std"):
        if not all(_finite(x) for x in stats[key]):
            raise FormatError(f"{name}: stats.{key} {stats[key]} are not finite")
    for c, (total, squares) in enumerate(zip(stats["sum"], stats["sum_sq"])):
        # uint8 values: 0 <= sum <= 255 N and 0 <= sum_sq <= 255 sum
        if not (0 <= total <= 255 * pixels and 0 <= squares <= 255 * total):
            raise FormatError(
                f"{name}: stats.sum/sum_sq of channel {c} ({total}, {squares}) are not sums "
                f"of {pixels} uint8 values"
            )
    return stats["mean"], stats["std"]


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False


def check_labels(labels: np.ndarray, n: int, name: str) -> None:
    """Every label is -1 (a pack of ``n`` = 0 classes, unlabelled) or a valid class index."""
    if not len(labels):
        return
    lo, hi = int(labels.min()), int(labels.max())
    if n == 0 and (lo, hi) != (-1, -1):
        raise FormatError(f"{name}: pack has no classes but labels span {lo}..{hi}")
    if n and (lo < 0 or hi >= n):
        bad = int(np.flatnonzero((labels < 0) | (labels >= n))[0])
        raise FormatError(
            f"{name}: record {bad} has label {int(labels[bad])}, expected 0..{n - 1} ({n} classes)"
        )


def check_path_offsets(first: int, last: int, paths: int, name: str) -> None:
    """The path offsets (``first`` and ``last`` of them) run from 0 to the paths' size."""
    if first != 0 or last != paths:
        raise FormatError(
            f"{name}: path offsets run {first}..{last}, the paths section has {paths} bytes"
        )
