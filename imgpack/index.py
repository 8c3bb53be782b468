"""``PackIndex``: a validated pack index, and what a reader asks of it afterwards.

``imgpack.format.read_index`` builds one after checking every byte range; this
class then serves the small per-record sections and record fields from the
file, refusing a .bin that is no longer the one it was read from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from imgpack.errors import FormatError, PackChangedError
from imgpack.fields import field_array, geometry_arrays
from imgpack.layout import CHANNELS, HEADER_BYTES, RecordField, Section, decode_header

__all__ = ["PackIndex"]


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
    channels: int = CHANNELS
    pack_id: str | None = None  # 32 hex digits (version 2); None for version 1 packs
    fields: dict[str, RecordField] = field(default_factory=dict)
    version: int = 1

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.height, self.width, self.channels)

    def section_array(self, name: str, buffer: Any) -> np.ndarray:
        """A zero-copy numpy view of section ``name`` inside ``buffer`` (a mmap or bytes)."""
        s = self.sections[name]
        return np.frombuffer(buffer, dtype=s.dtype, count=s.length, offset=s.offset)

    def check_same_pack(self, f: IO[bytes]) -> None:
        """Refuse a .bin (open as ``f``) that is no longer the file this index was read from."""
        f.seek(0)
        self.check_header(f.read(HEADER_BYTES), os.fstat(f.fileno()).st_size)

    def check_header(self, raw: bytes, size: int) -> None:
        """Refuse header bytes ``raw`` of a ``size``-byte .bin unless they are this pack's own.

        Version 2 packs compare their pack id; older ones their size, count and record size.
        Raises ``PackChangedError`` naming the file.
        """
        name = self.data_path.name
        try:
            head = decode_header(bytes(raw), name=name)
        except FormatError:
            head = None
        want = {"count": self.count, "record_bytes": self.record_bytes}
        if self.pack_id is not None:
            want["pack_id"] = self.pack_id
        if (
            size != self.data_file_bytes
            or head is None
            or any(head.get(k) != v for k, v in want.items())
        ):
            found = "no pack" if head is None else f"pack id {head.get('pack_id')}"
            raise PackChangedError(
                f"{name}: the pack changed on disk since it was opened "
                f"(id {self.pack_id}, {self.data_file_bytes} bytes; now {found}, {size} bytes);"
                f" reopen the dataset"
            )

    def read_ranges(self, *ranges: Section | RecordField) -> list[bytes]:
        """The bytes of each range, read with one open and one identity check of the .bin."""
        with open(self.data_path, "rb") as f:
            self.check_same_pack(f)
            out = []
            for r in ranges:
                f.seek(r.offset)
                out.append(f.read(r.nbytes))
            return out

    def read_section(self, name: str) -> np.ndarray:
        """Read section ``name`` from the .bin into memory (for small sections)."""
        s = self.sections[name]
        return np.frombuffer(self.read_ranges(s)[0], dtype=s.dtype)

    def read_fields(self, *names: str) -> list[np.ndarray | None]:
        """Record fields ``names`` as (count, *shape) arrays in memory (None where absent)."""
        present = [self.fields[n] for n in names if n in self.fields]
        data = iter(self.read_ranges(*present))
        return [
            field_array(next(data), self.fields[n], self.count) if n in self.fields else None
            for n in names
        ]

    def read_field(self, name: str) -> np.ndarray | None:
        """Record field ``name`` as a (count, *shape) array read into memory; None if absent."""
        return self.read_fields(name)[0]

    def geometry(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source_sizes int64 (N, 2), source_boxes f32 (N, 4), content_boxes f32 (N, 4));
        the whole record where the pack has no geometry (version 1)."""
        sizes, sources, contents = self.read_fields("source_size", "source_box", "content_box")
        return geometry_arrays(sizes, sources, contents, self.count, self.width, self.height)

    def target_vectors(self) -> np.ndarray | None:
        """The per-record target vectors, float32 (N, K), read-only; None when the pack has none."""
        t = self.read_field("targets")
        if t is None:
            return None
        t = t.astype(np.float32)
        t.flags.writeable = False
        return t

    def source_path(self, i: int, path_offsets: np.ndarray, paths: np.ndarray) -> str:
        """Record ``i``'s source path relative to SRC, from the two path sections."""
        return bytes(paths[int(path_offsets[i]) : int(path_offsets[i + 1])]).decode("utf-8")
