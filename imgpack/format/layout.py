"""The imgpack format's constants and byte layout: where every byte of a .bin goes.

The writer places sections with ``layout_sections``/``layout_fields`` and the
reader checks an index against the same functions, so the two cannot drift.
Standard library and numpy only, so the packer never pulls in torch and the
reader never pulls in Pillow.

A pack is two files side by side::

    NAME.bin   header (4096) | pixels | labels | checksums | path offsets | paths | record fields
    NAME.json  the index: what every byte range of NAME.bin means
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    "CHANNELS",
    "CHANNEL_COUNTS",
    "PACK_ID_BYTES",
    "Section",
    "RecordField",
    "pack_paths",
    "layout_sections",
    "layout_fields",
    "file_bytes",
    "encode_header",
    "decode_header",
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
