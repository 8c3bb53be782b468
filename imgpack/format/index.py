"""Open a pack: ``read_index`` checks it, ``PackIndex`` serves what a reader asks afterwards.

``read_index`` reads the index and the .bin's header and applies every rule of
``imgpack.format.checks``, in the order ``docs/format.md`` lists them; the
``PackIndex`` it returns then serves the small per-record sections and record
fields from the file, refusing a .bin that is no longer the one it was read from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from imgpack.errors import FormatError, PackChangedError
from imgpack.format.checks import (
    check_checksum,
    check_classes,
    check_counts,
    check_data_file,
    check_labels,
    check_layout,
    check_pack_id,
    check_path_offsets,
    check_shape,
    check_stats,
    check_version,
    parse_sections,
)
from imgpack.format.fields import field_array, geometry_arrays, parse_fields
from imgpack.format.layout import (
    CHANNELS,
    HEADER_BYTES,
    RecordField,
    Section,
    decode_header,
    pack_paths,
)
from imgpack.validate import load_json

__all__ = ["PackIndex", "read_index"]


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
    version = check_version(raw, name)
    count = raw["count"]
    h, w, c = check_shape(raw, version, name)
    sections = parse_sections(raw, name)
    check_counts(raw, sections, name)
    fields = parse_fields(raw["fields"], count, name) if version >= 2 else {}
    pack_id = check_pack_id(raw, version, name)
    check_layout(raw, sections, fields, name)

    data_path = check_data_file(raw["data_file"], json_path, name)
    if Path(path).suffix != ".json" and asked_bin.name != data_path.name:
        # Renamed packs: never read another .bin than the one the caller named.
        raise FormatError(
            f"{name}: index names data file {data_path.name!r}, but {asked_bin.name!r} was opened;"
            f" rename the files back or fix 'data_file'"
        )
    actual = _check_header(raw, data_path, name, version, (h, w, c), pack_id)

    classes = raw["classes"]
    check_classes(classes, name)
    check_checksum(raw["checksum"], name)
    mean, std = check_stats(raw["stats"], count * h * w, c, name)

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
    check_labels(np.frombuffer(labels, dtype=sections["labels"].dtype), len(classes), name)
    first, last = (int.from_bytes(b, "little") for b in (first, last))
    check_path_offsets(first, last, sections["paths"].nbytes, name)
    return index


def _check_header(
    raw: dict[str, Any],
    data_path: Path,
    name: str,
    version: int,
    shape: tuple[int, int, int],
    pack_id: str | None,
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
        ("record_bytes", raw["record_bytes"]),
        ("height", h),
        ("width", w),
        ("channels", c),
    ):
        if header[key] != want:
            raise FormatError(f"{data_path.name}: header {key} is {header[key]}, index says {want}")
    if version >= 2 and header["pack_id"] != pack_id:
        raise FormatError(
            f"{data_path.name}: header pack_id is {header['pack_id']}, index says {pack_id}"
            f" (the .bin and the .json are from different packs)"
        )
    return actual
