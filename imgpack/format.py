"""The imgpack on-disk format: one module, shared by the packer and the reader.

``docs/format.md`` is the prose spec; this module is its executable twin. It
imports only the standard library and numpy, so the packer never pulls in torch
and the reader never pulls in Pillow.

A pack is two files side by side::

    NAME.bin   header (4096 bytes) | pixels | labels | checksums | path offsets | paths
    NAME.json  the index: what every byte range of NAME.bin means

Readers must accept every format version ever written (``SUPPORTED_VERSIONS``).
"""

from __future__ import annotations

import json
import math
import os
import struct
import zlib
from dataclasses import dataclass, field
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

__all__ = [
    "MAGIC",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "SUPPORTED_VERSIONS",
    "HEADER_BYTES",
    "SECTION_ALIGN",
    "SECTION_DTYPES",
    "Section",
    "PackIndex",
    "pack_paths",
    "layout_sections",
    "encode_header",
    "decode_header",
    "record_checksum",
    "stats_from_sums",
    "build_index",
    "write_json_atomic",
    "read_index",
]

MAGIC = b"\x89IMGPACK"  # 8 bytes; the high byte catches 7-bit transfers, like PNG's
FORMAT_NAME = "imgpack"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
HEADER_BYTES = 4096  # pixels start page-aligned, so a record can be mapped without copying
SECTION_ALIGN = 64  # every section starts on a cache line
CHANNELS = 3

# magic, format version, header bytes, record count, record bytes, height, width, channels
_HEADER = struct.Struct("<8sIIQQIII")

# name -> numpy dtype (explicit little-endian) of each section after the pixels
SECTION_DTYPES = {
    "pixels": "|u1",
    "labels": "<i4",
    "checksums": "<u4",
    "path_offsets": "<u8",
    "paths": "|u1",
}


@dataclass(frozen=True)
class Section:
    """A byte range of the .bin holding one flat little-endian array."""

    offset: int
    nbytes: int
    dtype: str

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    @property
    def length(self) -> int:
        return self.nbytes // np.dtype(self.dtype).itemsize

    def to_json(self) -> dict[str, Any]:
        return {"offset": self.offset, "nbytes": self.nbytes, "dtype": self.dtype}


def _align(n: int, to: int = SECTION_ALIGN) -> int:
    return (n + to - 1) // to * to


def pack_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """Return (json_path, bin_path) for a pack named by either of its two files."""
    p = Path(path)
    if p.suffix == ".json":
        return p, p.with_suffix(".bin")
    return p.with_suffix(".json"), p


def layout_sections(count: int, record_bytes: int, paths_nbytes: int) -> dict[str, Section]:
    """Place every section of a pack of ``count`` records; the last one ends the file."""
    sizes = {
        "pixels": count * record_bytes,
        "labels": count * 4,
        "checksums": count * 4,
        "path_offsets": (count + 1) * 8,
        "paths": paths_nbytes,
    }
    sections, offset = {}, HEADER_BYTES
    for name, nbytes in sizes.items():
        sections[name] = Section(offset, nbytes, SECTION_DTYPES[name])
        offset = _align(offset + nbytes)
    return sections


def file_bytes(sections: dict[str, Section]) -> int:
    """Size of a .bin: the end of its last section, with no padding after it."""
    return max(s.end for s in sections.values())


def encode_header(count: int, height: int, width: int, version: int = FORMAT_VERSION) -> bytes:
    """The fixed 4096-byte header that makes a .bin recognisable without its index."""
    head = _HEADER.pack(
        MAGIC, version, HEADER_BYTES, count, height * width * CHANNELS, height, width, CHANNELS
    )
    return head + bytes(HEADER_BYTES - len(head))


def decode_header(raw: bytes, *, name: str = "data file") -> dict[str, int]:
    """Parse a header; raise FormatError naming ``name`` if it is not an imgpack header."""
    if len(raw) < _HEADER.size or raw[:8] != MAGIC:
        raise FormatError(
            f"{name}: not an imgpack data file (magic {raw[:8]!r}, expected {MAGIC!r})"
        )
    _, version, header_bytes, count, record_bytes, h, w, c = _HEADER.unpack_from(raw)
    return {
        "format_version": version,
        "data_offset": header_bytes,
        "count": count,
        "record_bytes": record_bytes,
        "height": h,
        "width": w,
        "channels": c,
    }


def record_checksum(buf: bytes | memoryview | np.ndarray) -> int:
    """CRC-32 of one record, the unit `verify` checks to find bit rot."""
    return zlib.crc32(buf) & 0xFFFFFFFF


def stats_from_sums(pixels: int, sums: list[int], sums_sq: list[int]) -> dict[str, Any]:
    """Per-channel mean/std on the 0..1 scale from exact integer sums of uint8 values.

    Integer sums make the result independent of worker count and let shards be
    merged exactly later.
    """
    if pixels == 0:
        mean = std = [0.0] * len(sums)
    else:
        mean = [s / pixels / 255.0 for s in sums]
        std = [
            math.sqrt(max(q * pixels - s * s, 0)) / pixels / 255.0 for s, q in zip(sums, sums_sq)
        ]
    return {"mean": mean, "std": std, "pixels": pixels, "sum": list(sums), "sum_sq": list(sums_sq)}


def build_index(
    *,
    data_file: str,
    count: int,
    height: int,
    width: int,
    classes: list[str],
    sections: dict[str, Section],
    stats: dict[str, Any],
    skipped: list[dict[str, str]],
    packer: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON index as a dict, fields in the order docs/format.md lists them."""
    index = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "data_file": data_file,
        "data_file_bytes": file_bytes(sections),
        "count": count,
        "shape": [height, width, CHANNELS],
        "dtype": "uint8",
        "layout": "HWC",
        "record_bytes": height * width * CHANNELS,
        "data_offset": HEADER_BYTES,
        "classes": list(classes),
        "sections": {name: s.to_json() for name, s in sections.items()},
        "checksum": {"algorithm": "crc32", "unit": "record"},
        "stats": stats,
        "skipped": skipped,
        "packer": packer,
    }
    index.update(extra or {})
    return index


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON under a temporary name in the same folder, fsync, then rename over ``path``."""
    path = Path(path)
    # not mkstemp: its 0600 mode would hide the index from other users of a shared dataset
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1, ensure_ascii=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- reading and validating ----------------------------------------------------

# field -> accepted JSON types; every one of these is required in version 1
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


@dataclass(frozen=True)
class PackIndex:
    """A validated index: everything a reader needs, and no per-record Python objects."""

    json_path: Path
    data_path: Path
    count: int
    height: int
    width: int
    record_bytes: int
    data_offset: int
    data_file_bytes: int
    classes: tuple[str, ...]
    sections: dict[str, Section]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    raw: dict[str, Any] = field(repr=False)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.height, self.width, CHANNELS)

    def section_array(self, name: str, buffer: Any) -> np.ndarray:
        """A zero-copy numpy view of section ``name`` inside ``buffer`` (a mmap or bytes)."""
        s = self.sections[name]
        return np.frombuffer(buffer, dtype=s.dtype, count=s.length, offset=s.offset)

    def read_section(self, name: str) -> np.ndarray:
        """Read section ``name`` from the .bin into memory (for small sections)."""
        s = self.sections[name]
        with open(self.data_path, "rb") as f:
            f.seek(s.offset)
            return np.frombuffer(f.read(s.nbytes), dtype=s.dtype)

    def source_path(self, i: int, path_offsets: np.ndarray, paths: np.ndarray) -> str:
        """Record ``i``'s source path relative to SRC, from the two path sections."""
        return bytes(paths[int(path_offsets[i]) : int(path_offsets[i + 1])]).decode("utf-8")


def _field(raw: dict[str, Any], key: str, name: str) -> Any:
    if key not in raw:
        raise MissingFieldError(f"{name}: missing required field {key!r}")
    value, kind = raw[key], _REQUIRED.get(key, object)
    # bool is an int in Python; a JSON true is never a valid count or size
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MissingFieldError(
            f"{name}: field {key!r} should be {kind.__name__}, found {type(value).__name__}"
        )
    if kind is int and value < 0:
        raise InconsistentPackError(f"{name}: field {key!r} is negative ({value})")
    return value


def _parse_sections(raw: dict[str, Any], name: str) -> dict[str, Section]:
    sections = {}
    for sec_name, dtype in SECTION_DTYPES.items():
        entry = raw["sections"].get(sec_name)
        if not isinstance(entry, dict):
            raise MissingFieldError(f"{name}: missing section {sec_name!r}")
        off, nbytes = entry.get("offset"), entry.get("nbytes")
        for v, what in ((off, "offset"), (nbytes, "nbytes")):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
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
    ):
        raise UnsafePathError(
            f"{name}: data_file {raw_name!r} is not a file name in the index's own folder"
        )
    return json_path.parent / raw_name


def read_index(path: str | os.PathLike) -> PackIndex:
    """Parse and validate a pack's index against its .bin; raise FormatError on any doubt.

    ``path`` may name the .json or the .bin. Costs one JSON parse, one header
    read and one pass over the labels section: well under a second for 1M records.
    """
    json_path, asked_bin = pack_paths(path)
    name = json_path.name
    try:
        text = json_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FormatError(
            f"{json_path}: index not found (a pack is NAME.bin plus NAME.json)"
        ) from None
    except UnicodeDecodeError as e:
        raise FormatError(
            f"{name}: index is not UTF-8 text ({e.reason} at byte {e.start})"
        ) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise FormatError(
            f"{name}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}"
        ) from None
    if not isinstance(raw, dict):
        raise FormatError(f"{name}: index should be a JSON object, found {type(raw).__name__}")

    if _field(raw, "format", name) != FORMAT_NAME:
        raise FormatError(f"{name}: format is {raw.get('format')!r}, expected {FORMAT_NAME!r}")
    version = _field(raw, "format_version", name)
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedVersionError(
            f"{name}: format_version {version} is not supported "
            f"(this imgpack reads {', '.join(map(str, SUPPORTED_VERSIONS))}); upgrade imgpack"
        )
    for key in _REQUIRED:
        _field(raw, key, name)

    count, record_bytes = raw["count"], raw["record_bytes"]
    shape = raw["shape"]
    if (
        len(shape) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape)
        or shape[2] != CHANNELS
    ):
        raise InconsistentPackError(f"{name}: shape {shape} is not [height, width, 3]")
    if raw["dtype"] != "uint8" or raw["layout"] != "HWC":
        raise InconsistentPackError(
            f"{name}: dtype/layout {raw['dtype']}/{raw['layout']} unsupported, expected uint8/HWC"
        )
    h, w, _ = shape
    if record_bytes != h * w * CHANNELS:
        raise InconsistentPackError(
            f"{name}: record_bytes {record_bytes} != {h}x{w}x{CHANNELS} = {h * w * CHANNELS}"
        )
    sections = _parse_sections(raw, name)
    pixels = sections["pixels"]
    if pixels.offset != raw["data_offset"]:
        raise InconsistentPackError(
            f"{name}: pixels start at {pixels.offset}, data_offset says {raw['data_offset']}"
        )
    for sec_name, s in sections.items():
        if s.offset % SECTION_ALIGN:
            raise InconsistentPackError(
                f"{name}: section {sec_name!r} starts at {s.offset}, "
                f"not a multiple of {SECTION_ALIGN}"
            )
    expected = {
        "pixels": count * record_bytes,
        "labels": count * 4,
        "checksums": count * 4,
        "path_offsets": (count + 1) * 8,
    }
    for sec_name, nbytes in expected.items():
        if sections[sec_name].nbytes != nbytes:
            raise InconsistentPackError(
                f"{name}: section {sec_name!r} has {sections[sec_name].nbytes} bytes, "
                f"{count} records need {nbytes}"
            )
    ordered = sorted(sections.items(), key=lambda kv: kv[1].offset)
    if ordered[0][1].offset < HEADER_BYTES:
        raise InconsistentPackError(f"{name}: section {ordered[0][0]!r} overlaps the header")
    for (a_name, a), (b_name, b) in zip(ordered, ordered[1:]):
        if a.end > b.offset:
            raise InconsistentPackError(f"{name}: sections {a_name!r} and {b_name!r} overlap")
    if ordered[-1][1].end != raw["data_file_bytes"]:
        raise InconsistentPackError(
            f"{name}: sections end at {ordered[-1][1].end}, "
            f"data_file_bytes says {raw['data_file_bytes']}"
        )

    data_path = _check_data_file(raw["data_file"], json_path, name)
    if Path(path).suffix != ".json" and asked_bin.name != data_path.name:
        # Renamed packs: never read another .bin than the one the caller named.
        raise InconsistentPackError(
            f"{name}: index names data file {data_path.name!r}, but {asked_bin.name!r} was opened;"
            f" rename the files back or fix 'data_file'"
        )
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
    for key, want in (
        ("format_version", version),
        ("data_offset", raw["data_offset"]),
        ("count", count),
        ("record_bytes", record_bytes),
        ("height", h),
        ("width", w),
        ("channels", CHANNELS),
    ):
        if header[key] != want:
            raise InconsistentPackError(
                f"{data_path.name}: header {key} is {header[key]}, index says {want}"
            )

    classes = raw["classes"]
    if not all(isinstance(c, str) for c in classes):
        raise MissingFieldError(f"{name}: classes must be a list of strings")
    if len(set(classes)) != len(classes):
        raise InconsistentPackError(f"{name}: classes {classes} name the same class twice")
    checksum = raw["checksum"]
    if checksum.get("algorithm") != "crc32" or checksum.get("unit") != "record":
        raise InconsistentPackError(
            f"{name}: checksum {checksum} unsupported, expected crc32 per record"
        )
    mean, std = _check_stats(raw["stats"], count * h * w, name)

    index = PackIndex(
        json_path=json_path,
        data_path=data_path,
        count=count,
        height=h,
        width=w,
        record_bytes=record_bytes,
        data_offset=raw["data_offset"],
        data_file_bytes=actual,
        classes=tuple(classes),
        sections=sections,
        mean=tuple(float(x) for x in mean),
        std=tuple(float(x) for x in std),
        raw=raw,
    )
    _check_labels(index, name)
    _check_path_offsets(index, name)
    return index


def _check_stats(stats: dict[str, Any], pixels: int, name: str) -> tuple[list, list]:
    """mean/std for the reader, plus the exact sums that let shards be merged."""
    numbers = (int, float)
    for key, kinds in (("mean", numbers), ("std", numbers), ("sum", int), ("sum_sq", int)):
        v = stats.get(key)
        if not (
            isinstance(v, list)
            and len(v) == CHANNELS
            and all(isinstance(x, kinds) and not isinstance(x, bool) for x in v)
        ):
            raise MissingFieldError(
                f"{name}: stats.{key} should be {CHANNELS} numbers, found {v!r}"
            )
    if stats.get("pixels") != pixels or isinstance(stats.get("pixels"), bool):
        raise InconsistentPackError(
            f"{name}: stats.pixels is {stats.get('pixels')!r}, count x height x width is {pixels}"
        )
    return stats["mean"], stats["std"]


def _check_labels(index: PackIndex, name: str) -> None:
    """Every label is -1 (unlabelled pack) or a valid class index."""
    if index.count == 0:
        return
    labels = index.read_section("labels")
    lo, hi = int(labels.min()), int(labels.max())
    n = len(index.classes)
    if n == 0 and (lo, hi) != (-1, -1):
        raise InconsistentPackError(f"{name}: pack has no classes but labels span {lo}..{hi}")
    if n and (lo < 0 or hi >= n):
        bad = int(np.flatnonzero((labels < 0) | (labels >= n))[0])
        raise InconsistentPackError(
            f"{name}: record {bad} has label {int(labels[bad])}, expected 0..{n - 1} ({n} classes)"
        )


def _check_path_offsets(index: PackIndex, name: str) -> None:
    """The path offsets start at 0 and end at the size of the paths section (2 reads)."""
    s = index.sections["path_offsets"]
    with open(index.data_path, "rb") as f:
        f.seek(s.offset)
        first = int(np.frombuffer(f.read(8), dtype="<u8")[0])
        f.seek(s.end - 8)
        last = int(np.frombuffer(f.read(8), dtype="<u8")[0])
    paths = index.sections["paths"].nbytes
    if first != 0 or last != paths:
        raise InconsistentPackError(
            f"{name}: path offsets run {first}..{last}, the paths section has {paths} bytes"
        )
