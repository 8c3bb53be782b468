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

from imgpack.errors import (
    FormatError,
    InconsistentPackError,
    MissingFieldError,
    UnsafePathError,
    UnsupportedVersionError,
)
from imgpack.format.layout import (
    CHANNEL_COUNTS,
    CHANNELS,
    FORMAT_NAME,
    HEADER_BYTES,
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

# field -> accepted JSON types; every one of these is required (record_bytes before
# version 3, codec from version 3 on)
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
    "codec": str,
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
_ONLY_BEFORE_V3, _FROM_V3 = "record_bytes", "codec"
_PACK_ID = re.compile(r"[0-9a-f]{32}", re.ASCII)


def _field(raw: dict[str, Any], key: str, name: str, kind: type) -> Any:
    if kind is int:
        return require_count(raw, key, name, MissingFieldError, InconsistentPackError)
    return require(raw, key, kind, name, MissingFieldError)


def check_version(raw: dict[str, Any], name: str) -> int:
    """An imgpack index of a version this imgpack reads, with every field it requires.

    The version is checked before any other field: other versions may have other fields.
    """
    if _field(raw, "format", name, str) != FORMAT_NAME:
        raise FormatError(f"{name}: format is {raw.get('format')!r}, expected {FORMAT_NAME!r}")
    version = _field(raw, "format_version", name, int)
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedVersionError(
            f"{name}: format_version {version} is not supported "
            f"(this imgpack reads {', '.join(map(str, SUPPORTED_VERSIONS))}); upgrade imgpack"
        )
    required = {**_REQUIRED, **(_REQUIRED_V2 if version >= 2 else {})}
    required.pop(_ONLY_BEFORE_V3 if version >= 3 else _FROM_V3)
    for key, kind in required.items():
        _field(raw, key, name, kind)
    return version


def parse_sections(raw: dict[str, Any], name: str) -> dict[str, Section]:
    """The five base sections, each with its standard dtype and a whole number of elements."""
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
        raise UnsafePathError(
            f"{name}: data_file {raw_name!r} is not a file name in the index's own folder"
        )
    return json_path.parent / raw_name


def check_shape(raw: dict[str, Any], version: int, name: str) -> tuple[int, int, int]:
    """(height, width, channels): uint8 HWC records of a channel count the version allows."""
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
    if version < 3 and raw["record_bytes"] != h * w * c:
        raise InconsistentPackError(
            f"{name}: record_bytes {raw['record_bytes']} != {h}x{w}x{c} = {h * w * c}"
        )
    return h, w, c


def check_counts(raw: dict[str, Any], sections: dict[str, Section], name: str) -> None:
    """Every per-record base section has the size that ``count`` implies (version 3's
    pixels: the record sizes do, ``check_record_sizes``)."""
    count = raw["count"]
    if raw["format_version"] >= 3:
        pixels = sections["pixels"].nbytes
    else:
        pixels = count * raw["record_bytes"]
    expected = layout_sections(count, pixels, 0)  # the sizes the packer lays out
    for sec_name, want in expected.items():
        nbytes = want.nbytes
        if sec_name != "paths" and sections[sec_name].nbytes != nbytes:
            raise InconsistentPackError(
                f"{name}: section {sec_name!r} has {sections[sec_name].nbytes} bytes, "
                f"{count} records need {nbytes}"
            )


def check_pack_id(raw: dict[str, Any], version: int, name: str) -> str | None:
    """Version 2's pack id (32 lowercase hex digits); None for version 1."""
    pack_id = raw["pack_id"] if version >= 2 else None  # a required string in version 2
    if pack_id is not None and not _PACK_ID.fullmatch(pack_id):
        raise InconsistentPackError(f"{name}: pack_id {pack_id!r} is not 32 lowercase hex digits")
    return pack_id


def check_layout(
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


def check_classes(classes: Any, name: str) -> None:
    """Distinct class names: label k means ``classes[k]``."""
    if not is_str_list(classes):
        raise MissingFieldError(f"{name}: classes must be a list of strings")
    if len(set(classes)) != len(classes):
        raise InconsistentPackError(f"{name}: classes {classes} name the same class twice")


def check_checksum(checksum: dict[str, Any], name: str) -> None:
    """The checksums section holds what this imgpack verifies: a CRC-32 per record."""
    if checksum.get("algorithm") != "crc32" or checksum.get("unit") != "record":
        raise InconsistentPackError(
            f"{name}: checksum {checksum} unsupported, expected crc32 per record"
        )


def check_stats(
    stats: dict[str, Any],
    pixels: int,
    channels: int,
    name: str,
    what: str = "count x height x width",
):
    """mean/std for the reader, plus the exact sums that let shards be merged.

    ``pixels`` is how many pixels (per channel) the records hold, ``what`` says whence."""
    for key, ok in (("mean", is_number), ("std", is_number), ("sum", is_int), ("sum_sq", is_int)):
        v = stats.get(key)
        if not (isinstance(v, list) and len(v) == channels and all(ok(x) for x in v)):
            raise MissingFieldError(
                f"{name}: stats.{key} should be {channels} numbers, found {v!r}"
            )
    if stats.get("pixels") != pixels or isinstance(stats.get("pixels"), bool):
        raise InconsistentPackError(
            f"{name}: stats.pixels is {stats.get('pixels')!r}, {what} is {pixels}"
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


def check_labels(labels: np.ndarray, n: int, name: str) -> None:
    """Every label is -1 (a pack of ``n`` = 0 classes, unlabelled) or a valid class index."""
    if not len(labels):
        return
    lo, hi = int(labels.min()), int(labels.max())
    if n == 0 and (lo, hi) != (-1, -1):
        raise InconsistentPackError(f"{name}: pack has no classes but labels span {lo}..{hi}")
    if n and (lo < 0 or hi >= n):
        bad = int(np.flatnonzero((labels < 0) | (labels >= n))[0])
        raise InconsistentPackError(
            f"{name}: record {bad} has label {int(labels[bad])}, expected 0..{n - 1} ({n} classes)"
        )


def check_path_offsets(first: int, last: int, paths: int, name: str) -> None:
    """The path offsets (``first`` and ``last`` of them) run from 0 to the paths' size."""
    if first != 0 or last != paths:
        raise InconsistentPackError(
            f"{name}: path offsets run {first}..{last}, the paths section has {paths} bytes"
        )
