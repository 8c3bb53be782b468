"""Open a pack: ``read_index`` checks it, ``PackIndex`` serves what a reader asks afterwards.

``read_index`` reads the index and the .bin's header and applies every rule of
``imgpack.format.checks``, in the order ``docs/format.md`` lists them; the
``PackIndex`` it returns then serves the small per-record sections and record
fields from the file, refusing a .bin that is no longer the one it was read from,
and says where each record lies (``record_sizes``, ``record_lengths``, ``record_offsets``:
records differ in size, and their bytes depend on the codec).
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
from imgpack.format.datafile import check_data_file_header, read_data_ranges, read_from
from imgpack.format.fields import (
    RECORD_LENGTH,
    RECORD_SIZE,
    field_array,
    geometry_arrays,
    parse_fields,
)
from imgpack.format.layout import (
    CHANNELS,
    FORMAT_VERSION,
    HEADER_BYTES,
    RecordField,
    Section,
    decode_header,
    pack_paths,
    record_nbytes,
    record_offsets,
)
from imgpack.format.records import (
    check_codec,
    check_jpeg,
    check_record_sizes,
    check_standard_fields,
)
from imgpack.validate import load_json

__all__ = ["PackIndex", "read_index"]


@dataclass(frozen=True)
class PackIndex:
    """A validated index: everything a reader needs, and no per-record Python objects.

    ``height``/``width`` are the bound: every record is at most that. ``record_bytes`` is
    ``H * W * C`` when every record is H x W raw (``uniform``: a batch is one gather), else
    None.
    """

    json_path: Path
    data_path: Path
    count: int
    height: int
    width: int
    record_bytes: int | None
    data_offset: int
    data_file_bytes: int
    classes: tuple[str, ...]
    sections: dict[str, Section]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    pack_id: str  # 32 hex digits: the index's and the header's, equal (read_index checks)
    raw: dict[str, Any] = field(repr=False)
    channels: int = CHANNELS
    fields: dict[str, RecordField] = field(default_factory=dict)
    version: int = FORMAT_VERSION
    codec: str = "raw"
    quality: int | None = None  # jpeg: the quality its records were encoded at
    # per-record arrays computed on first use; never pickled (a DataLoader worker that
    # needs them reads them again), so no state that travels grows with the record count
    _cache: dict[str, np.ndarray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.height, self.width, self.channels)

    @property
    def uniform(self) -> bool:
        """Every record is H x W and raw: record i at ``data_offset + i * record_bytes``."""
        return self.record_bytes is not None

    @property
    def record_sizes(self) -> np.ndarray:
        """(width, height) of every record, int64 (N, 2), read-only: the ``record_size``
        field, read from the .bin when first asked for."""
        return self._cached("sizes", lambda: self.read_field(RECORD_SIZE).astype(np.int64))

    @property
    def record_lengths(self) -> np.ndarray:
        """Bytes of every record as stored, int64 (N,), read-only: jpeg's ``record_length``
        field, read when first asked for; the other codecs' follow from the sizes."""

        def lengths() -> np.ndarray:
            if self.codec == "jpeg":
                return self.read_field(RECORD_LENGTH).astype(np.int64).reshape(-1)
            wh = self.record_sizes
            return np.asarray(
                record_nbytes(self.codec, wh[:, 0], wh[:, 1], self.channels), np.int64
            )

        return self._cached("lengths", lengths)

    @property
    def record_offsets(self) -> np.ndarray:
        """Where record i starts, relative to ``data_offset``: int64 (N + 1,), read-only;
        the last entry is the pixels section's size (``layout.record_offsets``)."""
        lengths = self.record_lengths if self.codec == "jpeg" else None
        return self._cached(
            "offsets", lambda: record_offsets(self.codec, self.record_sizes, self.channels, lengths)
        )

    def _cached(self, key: str, make: Any) -> np.ndarray:
        """``make()``, read-only, computed on first use and kept (never pickled)."""
        if key not in self._cache:
            array = make()
            array.flags.writeable = False
            self._cache[key] = array
        return self._cache[key]

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

        Compares the size, count, pixels' size and pack id. Raises ``PackChangedError``
        naming the file.
        """
        name = self.data_path.name
        try:
            head = decode_header(bytes(raw), name=name)
        except FormatError:
            head = None
        want: dict[str, Any] = {
            "count": self.count,
            "pixels_nbytes": self.sections["pixels"].nbytes,
            "pack_id": self.pack_id,
        }
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
            return read_from(f, ranges)

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
        each record as its whole source where the pack has no geometry fields."""
        sizes, sources, contents = self.read_fields("source_size", "source_box", "content_box")
        return geometry_arrays(sizes, sources, contents, self.record_sizes)

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

    ``path`` may name the .json or the .bin. Costs one JSON parse, one header read and
    one pass over the labels and record sizes (jpeg: and lengths), as numpy arrays: no
    Python object per record.
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
    h, w, c = check_shape(raw, name)
    codec = check_codec(raw, c, name)
    sections = parse_sections(raw, name)
    check_counts(raw, sections, name)
    fields = parse_fields(raw["fields"], count, name)
    check_standard_fields(fields, codec, name)
    quality = check_jpeg(raw, codec, count, name)
    pack_id = check_pack_id(raw, name)
    check_layout(raw, sections, fields, name)

    data_path = check_data_file(raw["data_file"], json_path, name)
    if Path(path).suffix != ".json" and asked_bin.name != data_path.name:
        # Renamed packs: never read another .bin than the one the caller named.
        raise FormatError(
            f"{name}: index names data file {data_path.name!r}, but {asked_bin.name!r} was opened;"
            f" rename the files back or fix 'data_file'"
        )
    actual = check_data_file_header(
        raw, data_path, name, version, (h, w, c), pack_id, codec, sections
    )

    classes = raw["classes"]
    check_classes(classes, name)
    check_checksum(raw["checksum"], name)
    po = sections["path_offsets"]
    ranges = [
        sections["labels"],
        Section(po.offset, 8, po.dtype),
        Section(po.end - 8, 8, po.dtype),
        fields[RECORD_SIZE],
    ]
    if codec == "jpeg":
        ranges.append(fields[RECORD_LENGTH])
    # one open for every check that reads the .bin
    labels, first, last, sizes, *lengths = read_data_ranges(data_path, name, ranges)
    pixels, uniform = check_record_sizes(
        field_array(sizes, fields[RECORD_SIZE], count),
        (h, w, c),
        codec,
        sections["pixels"].nbytes,
        name,
        field_array(lengths[0], fields[RECORD_LENGTH], count) if lengths else None,
    )
    mean, std = check_stats(raw["stats"], pixels, c, name)

    index = PackIndex(
        json_path=json_path,
        data_path=data_path,
        count=count,
        height=h,
        width=w,
        record_bytes=h * w * c if uniform else None,
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
        codec=codec,
        quality=quality,
    )
    check_labels(np.frombuffer(labels, dtype=sections["labels"].dtype), len(classes), name)
    first, last = (int.from_bytes(b, "little") for b in (first, last))
    check_path_offsets(first, last, sections["paths"].nbytes, name)
    return index
