"""The imgpack format's constants and byte layout: where every byte of a .bin goes.

The writer places sections with ``layout_sections``/``layout_fields`` and the
reader checks an index against the same functions, so the two cannot drift.
Standard library and numpy only, so the packer never pulls in torch and the
reader never pulls in Pillow.

A pack is two files side by side::

    NAME.bin   header (4096) | pixels | labels | checksums | path offsets | paths | record fields
    NAME.json  the index: what every byte range of NAME.bin means

Records may differ in size (each within the pack's bound) and carry a codec;
``record_offsets`` is the one function that says where each record lies.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.errors import FormatError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "SUPPORTED_VERSIONS",
    "PRE_RELEASE_VERSIONS",
    "HEADER_BYTES",
    "SECTION_ALIGN",
    "SECTION_DTYPES",
    "CHANNEL_COUNTS",
    "PACK_ID_BYTES",
    "CODECS",
    "Section",
    "RecordField",
    "pack_paths",
    "layout_sections",
    "layout_fields",
    "file_bytes",
    "record_nbytes",
    "record_offsets",
    "encode_header",
    "decode_header",
]

MAGIC = b"\x89IMGPACK"  # 8 bytes; the high byte catches 7-bit transfers, like PNG's
FORMAT_NAME = "imgpack"
FORMAT_VERSION = 3
# every version written since the first release (3) stays readable: this only grows
SUPPORTED_VERSIONS = (3,)
# never released; refused with a message that says to repack
PRE_RELEASE_VERSIONS = (1, 2)
HEADER_BYTES = 4096  # pixels start page-aligned, so a record can be mapped without copying
SECTION_ALIGN = 64  # every section starts on a cache line
CHANNEL_COUNTS = (1, 3)  # grayscale (L) or RGB
PACK_ID_BYTES = 16
# how a record's pixels are stored; the index says the name, the header its number
CODECS = ("raw", "yuv420", "jpeg")

# magic, format version, header bytes, record count, bytes of the pixels section, height,
# width (the bound), channels (the fixed fields, 44 bytes); then the pack id and the codec's number
_HEADER = struct.Struct("<8sIIQQIII16sI")
_HEADER_KEYS = (
    "format_version data_offset count pixels_nbytes height width channels pack_id codec"
).split()

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
    end = property(lambda self: self.offset + self.nbytes)  # where the next may start

    def to_json(self) -> dict[str, Any]:
        """Its entry in the index: its fields, in order (a record field's shape as a list)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class RecordField(Section):
    """A section with one fixed-shape element per record (the index's ``fields``)."""

    shape: tuple[int, ...] = ()
    required: bool = False


def _align(n: int, to: int = SECTION_ALIGN) -> int:
    return (n + to - 1) // to * to


def pack_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """Return (json_path, bin_path) for a pack named by either of its two files."""
    p = Path(path)
    return (p, p.with_suffix(".bin")) if p.suffix == ".json" else (p.with_suffix(".json"), p)


def record_nbytes(codec: str, width: Any, height: Any, channels: int) -> Any:
    """Bytes of one record of ``width`` x ``height`` stored as ``codec``: ints or numpy int arrays.

    raw: ``h * w * C`` (HWC); yuv420 (C = 3): the Y plane ``w * h`` then the Cb and Cr
    planes of ``ceil(w/2) * ceil(h/2)`` each. jpeg has no such number: its records'
    lengths are stored (the ``record_length`` field). Callers ask for raw and yuv420 only,
    with a codec and channels already checked (the index's rules, the packer's settings).
    """
    if codec == "yuv420":
        return width * height + 2 * ((width + 1) // 2) * ((height + 1) // 2)
    return height * width * channels


def record_offsets(codec: str, sizes: Any, channels: int, lengths: Any = None) -> np.ndarray:
    """Where each record starts, relative to the pixels: int64 (N + 1,), the last is the end.

    ``sizes`` is (N, 2) of (width, height); ``lengths`` (N,) or (N, 1) the stored bytes of each
    record, which jpeg needs (its ``record_length`` field) and the others ignore. The one
    function that places records: the writer and the reader both call it, so no offset
    is stored. Callers bound the sizes and lengths first (the reader: within the pack's
    bound, u4 lengths), so int64 cannot overflow.
    """
    wh = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
    nbytes = lengths if codec == "jpeg" else record_nbytes(codec, wh[:, 0], wh[:, 1], channels)
    return np.concatenate(([0], np.cumsum(nbytes, dtype=np.int64)))


def layout_sections(count: int, pixels_nbytes: int, paths_nbytes: int) -> dict[str, Section]:
    """Place the five base sections of a pack of ``count`` records, one after the other.

    ``pixels_nbytes`` is the whole pixels section: ``record_offsets(...)[-1]``.
    """
    # in SECTION_DTYPES' order: pixels, labels, checksums, path offsets (N + 1), paths
    sizes = (pixels_nbytes, count * 4, count * 4, (count + 1) * 8, paths_nbytes)
    sections, offset = {}, HEADER_BYTES
    for (name, dtype), nbytes in zip(SECTION_DTYPES.items(), sizes):
        sections[name] = Section(offset, nbytes, dtype)
        offset = _align(offset + nbytes)
    return sections


def layout_fields(
    sections: dict[str, Section], count: int, fields: Sequence[tuple[str, str, tuple[int, ...]]]
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


def encode_header(**fields: Any) -> bytes:
    """The fixed 4096-byte header that makes a .bin recognisable without its index.

    ``fields`` are what ``decode_header`` returns but the format version and the data
    offset, which are this version's: ``count``, ``pixels_nbytes``, ``height`` and ``width``
    (the bound), ``channels``, ``pack_id`` (16 bytes: ``write.compute_pack_id``) and
    ``codec`` (a name in ``CODECS``, stored as its number). ``_HEADER_KEYS`` is their order
    for both: the pixels section's size at bytes 24..31, the pack id at 44, the codec at 60.
    """
    values = {**fields, "format_version": FORMAT_VERSION, "data_offset": HEADER_BYTES}
    values["codec"] = CODECS.index(fields["codec"])
    return _HEADER.pack(MAGIC, *(values[k] for k in _HEADER_KEYS)).ljust(HEADER_BYTES, b"\0")


def decode_header(raw: bytes, *, name: str = "data file") -> dict[str, Any]:
    """Parse a header; raise FormatError naming ``name`` if it is not an imgpack header.

    The fields are read as the current version lays them out, whatever version the
    header states: the caller compares ``format_version`` before trusting any other.
    Keys: those of ``PackIndex.header``; the pack id as hex, an unknown codec as its number.
    """
    if len(raw) < _HEADER.size or raw[:8] != MAGIC:
        raise FormatError(
            f"{name}: not an imgpack data file (magic {bytes(raw[:8])!r}, expected {MAGIC!r})"
        )
    head = dict(zip(_HEADER_KEYS, _HEADER.unpack_from(raw)[1:]))
    head["pack_id"] = head["pack_id"].hex()
    number = head["codec"]
    head["codec"] = CODECS[number] if number < len(CODECS) else number
    return head
