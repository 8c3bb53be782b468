"""The .bin as ``read_index`` opens it: its size and header against the index, and the
few byte ranges that validation reads (labels, path offsets, record sizes and lengths).

Every failure is a one-line ``FormatError`` naming the file. Standard library and numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from imgpack.errors import FormatError
from imgpack.format.layout import HEADER_BYTES, Section, decode_header

__all__ = ["check_data_file_header", "read_data_ranges", "read_from"]


def check_data_file_header(
    raw: dict[str, Any],
    data_path: Path,
    name: str,
    version: int,
    shape: tuple[int, int, int],
    pack_id: str,
    codec: str,
    sections: dict[str, Section],
) -> int:
    """The .bin's size and header agree with the index; return its size."""
    h, w, c = shape
    try:
        actual = data_path.stat().st_size
        if actual != raw["data_file_bytes"]:
            raise FormatError(
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
        ("pixels_nbytes", sections["pixels"].nbytes),
        ("codec", codec),
        ("height", h),
        ("width", w),
        ("channels", c),
    ):
        if header[key] != want:
            raise FormatError(f"{data_path.name}: header {key} is {header[key]}, index says {want}")
    if header["pack_id"] != pack_id:
        raise FormatError(
            f"{data_path.name}: header pack_id is {header['pack_id']}, index says {pack_id}"
            f" (the .bin and the .json are from different packs)"
        )
    return actual


def read_data_ranges(data_path: Path, name: str, ranges: list[Section]) -> list[bytes]:
    """The bytes of each range of the .bin (its size already checked), with one open."""
    try:
        with open(data_path, "rb") as f:
            out = read_from(f, ranges)
    except OSError as e:
        raise FormatError(
            f"{name}: cannot read data file {data_path.name} ({e.strerror or e})"
        ) from None
    if any(len(b) != r.nbytes for b, r in zip(out, ranges)):
        raise FormatError(f"{data_path.name}: file ends early (changed while read?)")
    return out


def read_from(f: IO[bytes], ranges: Sequence[Section]) -> list[bytes]:
    """The bytes of each range of the open file ``f`` (fewer where the file ends early)."""
    out = []
    for r in ranges:
        f.seek(r.offset)
        out.append(f.read(r.nbytes))
    return out
