"""The imgpack format's constants and byte layout: what a writer lays down, byte for byte.

``docs/format.md`` is the prose spec; this module and ``imgpack.format`` (the
validating parser, which re-exports everything here) are its executable twin.
Standard library and numpy only, so the packer never pulls in torch and the
reader never pulls in Pillow.

A pack is two files side by side::

    NAME.bin   header (4096) | pixels | labels | checksums | path offsets | paths | record fields
    NAME.json  the index: what every byte range of NAME.bin means
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from imgpack.errors import FormatError

__all__ = [
    "MAGIC",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "SUPPORTED_VERSIONS",
    "HEADER_BYTES",
    "SECTION_ALIGN",
    "SECTION_DTYPES",
    "CHANNEL_COUNTS",
    "PACK_ID_BYTES",
    "FieldSpec",
    "RECORD_FIELDS",
    "GEOMETRY_FIELDS",
    "FIELD_DTYPES",
    "Section",
    "RecordField",
    "Geometry",
    "whole_record",
    "pack_paths",
    "layout_sections",
    "layout_fields",
    "file_bytes",
    "encode_header",
    "decode_header",
    "record_checksum",
    "stats_from_sums",
    "compute_pack_id",
    "build_index",
    "write_json_atomic",
]

MAGIC = b"\x89IMGPACK"  # 8 bytes; the high byte catches 7-bit transfers, like PNG's
FORMAT_NAME = "imgpack"
FORMAT_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)
HEADER_BYTES = 4096  # pixels start page-aligned, so a record can be mapped without copying
SECTION_ALIGN = 64  # every section starts on a cache line
CHANNELS = 3  # version 1's only channel count, and version 2's default
CHANNEL_COUNTS = (1, 3)  # version 2: grayscale (L) or RGB
PACK_ID_BYTES = 16

# magic, format version, header bytes, record count, record bytes, height, width, channels
_HEADER = struct.Struct("<8sIIQQIII")
_PACK_ID_AT = _HEADER.size  # version 2: the pack id follows the fixed fields (44..60)

# name -> numpy dtype (explicit little-endian) of each section after the pixels
SECTION_DTYPES = {
    "pixels": "|u1",
    "labels": "<i4",
    "checksums": "<u4",
    "path_offsets": "<u8",
    "paths": "|u1",
}

# dtypes a record field may have: explicit byte order, fixed width
FIELD_DTYPES = ("|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8")


@dataclass(frozen=True)
class FieldSpec:
    """A standard record field: its dtype and per-record shape (None: any positive length)."""

    dtype: str
    shape: tuple[int | None, ...]


# the record fields this imgpack understands; any other one is read only if optional
RECORD_FIELDS = {
    "source_size": FieldSpec("<u4", (2,)),  # (width, height) of the source after EXIF rotation
    "source_box": FieldSpec("<f4", (4,)),  # (l, t, r, b) in source pixels that the record shows
    "content_box": FieldSpec("<f4", (4,)),  # (l, t, r, b) in record pixels where that lies
    "targets": FieldSpec("<f4", (None,)),  # a fixed-length target vector per record
}
GEOMETRY_FIELDS = ("source_size", "source_box", "content_box")


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


@dataclass(frozen=True)
class RecordField(Section):
    """A section with one fixed-shape element per record (version 2 ``fields``)."""

    shape: tuple[int, ...] = ()
    required: bool = False

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "shape": list(self.shape), "required": self.required}


class Geometry(NamedTuple):
    """Where a record came from: source size (w, h) after EXIF rotation, and two boxes.

    Record pixel x_r shows source x_s = sbox.l + (x_r - cbox.l) * sbox.w / cbox.w (same in y).
    """

    source_size: tuple[int, int]
    source_box: tuple[float, float, float, float]
    content_box: tuple[float, float, float, float]


def whole_record(width: int, height: int) -> Geometry:
    """The geometry of a record that is its whole source: what version 1 packs imply."""
    box = (0.0, 0.0, float(width), float(height))
    return Geometry((width, height), box, box)


def _align(n: int, to: int = SECTION_ALIGN) -> int:
    return (n + to - 1) // to * to


def pack_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """Return (json_path, bin_path) for a pack named by either of its two files."""
    p = Path(path)
    if p.suffix == ".json":
        return p, p.with_suffix(".bin")
    return p.with_suffix(".json"), p


def layout_sections(count: int, record_bytes: int, paths_nbytes: int) -> dict[str, Section]:
    """Place the five base sections of a pack of ``count`` records, one after the other."""
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


def layout_fields(
    sections: dict[str, Section],
    count: int,
    fields: Sequence[tuple[str, str, tuple[int, ...]]],
) -> dict[str, RecordField]:
    """Place record fields ``(name, dtype, shape)`` after the last base section, in order."""
    out, offset = {}, _align(sections["paths"].end)
    for name, dtype, shape in fields:
        nbytes = count * math.prod(shape) * np.dtype(dtype).itemsize
        out[name] = RecordField(offset, nbytes, dtype, tuple(shape))
        offset = _align(offset + nbytes)
    return out


def file_bytes(sections: dict[str, Section], fields: dict[str, RecordField] | None = None) -> int:
    """Size of a .bin: the end of its last section, with no padding after it."""
    return max(s.end for s in (*sections.values(), *(fields or {}).values()))


def encode_header(
    count: int,
    height: int,
    width: int,
    version: int = FORMAT_VERSION,
    *,
    channels: int = CHANNELS,
    pack_id: bytes = b"",
) -> bytes:
    """The fixed 4096-byte header that makes a .bin recognisable without its index."""
    head = _HEADER.pack(
        MAGIC, version, HEADER_BYTES, count, height * width * channels, height, width, channels
    )
    head += pack_id
    return head + bytes(HEADER_BYTES - len(head))


def decode_header(raw: bytes, *, name: str = "data file") -> dict[str, Any]:
    """Parse a header; raise FormatError naming ``name`` if it is not an imgpack header."""
    if len(raw) < _HEADER.size or raw[:8] != MAGIC:
        raise FormatError(
            f"{name}: not an imgpack data file (magic {raw[:8]!r}, expected {MAGIC!r})"
        )
    _, version, header_bytes, count, record_bytes, h, w, c = _HEADER.unpack_from(raw)
    head = {
        "format_version": version,
        "data_offset": header_bytes,
        "count": count,
        "record_bytes": record_bytes,
        "height": h,
        "width": w,
        "channels": c,
    }
    if version >= 2:
        head["pack_id"] = raw[_PACK_ID_AT : _PACK_ID_AT + PACK_ID_BYTES].hex()
    return head


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


def compute_pack_id(
    *, shape: Sequence[int], count: int, classes: Sequence[str], payloads: Sequence[bytes]
) -> bytes:
    """The pack's identity: 16 bytes of SHA-256 over what its records are.

    ``payloads`` are the bytes of every section but the pixels, which the checksums
    stand for, and of every record field. Derived, not drawn at random: the same
    folder packed twice (any worker count, resumed or not) is the same bytes,
    while any other record, label, path, class list or field gives another id.
    """
    h = hashlib.sha256(b"imgpack pack id 2\n")
    h.update(json.dumps([list(shape), count, list(classes)], ensure_ascii=False).encode("utf-8"))
    for payload in payloads:
        h.update(len(payload).to_bytes(8, "little"))
        h.update(payload)
    return h.digest()[:PACK_ID_BYTES]


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
    channels: int = CHANNELS,
    fields: dict[str, RecordField] | None = None,
    pack_id: str | None = None,
    version: int = FORMAT_VERSION,
) -> dict[str, Any]:
    """The JSON index as a dict, fields in the order docs/format.md lists them.

    ``version=1`` gives the old layout (no ``pack_id``, no ``fields``, 3 channels).
    """
    index = {
        "format": FORMAT_NAME,
        "format_version": version,
        "data_file": data_file,
        "data_file_bytes": file_bytes(sections, fields),
        "count": count,
        "shape": [height, width, channels],
        "dtype": "uint8",
        "layout": "HWC",
        "record_bytes": height * width * channels,
        "data_offset": HEADER_BYTES,
        "classes": list(classes),
        "sections": {name: s.to_json() for name, s in sections.items()},
    }
    if version >= 2:
        index["fields"] = {name: f.to_json() for name, f in (fields or {}).items()}
        index["pack_id"] = pack_id
    index.update(
        {
            "checksum": {"algorithm": "crc32", "unit": "record"},
            "stats": stats,
            "skipped": skipped,
            "packer": packer,
        }
    )
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
