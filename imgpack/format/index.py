"""Open a pack: ``read_index`` checks an index against its .bin, ``PackIndex`` serves it after.

``read_index`` applies the rules of ``docs/format.md`` ("Rules for readers") in the order
listed there, each a one-line ``FormatError`` that starts with the offending file's name.
It reads the index, the .bin's header and the few ranges validation needs (labels, the
path offsets' ends, record sizes and lengths), with one open of each file and no Python
object per record. The ``PackIndex`` it returns then serves the small per-record sections
and record fields from the file, refusing a .bin that is no longer the one it was read
from (``PackChangedError``), and says where each record lies.

No record offset is stored: ``layout.record_offsets`` derives them from the record sizes
(jpeg: from the ``record_length`` field), and validation is that every size lies within
the pack's bound and the computed end is the pixels section's size (which the header
states too). Standard library and numpy only.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from imgpack.errors import FormatError, PackChangedError
from imgpack.format import fields, layout
from imgpack.format.fields import RECORD_LENGTH, RECORD_SIZE
from imgpack.format.write import sums_possible
from imgpack.validate import is_count, is_int, is_int_list, is_number, is_str_list, load_json

__all__ = ["PackIndex", "read_index", "parse_sections"]

# every top-level field an index must hold, by JSON type (the jpeg object of a jpeg pack
# is checked with the codec's fields)
_REQUIRED = {
    **dict.fromkeys(["format", "data_file", "dtype", "layout", "codec", "pack_id"], str),
    **dict.fromkeys(["format_version", "data_file_bytes", "count", "data_offset"], int),
    **dict.fromkeys(["shape", "classes", "skipped"], list),
    **dict.fromkeys(["sections", "fields", "checksum", "stats", "packer"], dict),
}
_PACK_ID = re.compile(r"[0-9a-f]{32}", re.ASCII)
_MAX_PIXELS_NBYTES = 2**63  # what int64 offsets (and any file system) can place
_MAX_LENGTH = 2**32 - 1  # a record_length is <u4
_MIN_JPEG = 2  # a JPEG stream starts with SOI (FF D8): no record can be shorter
_CHUNK = 1 << 14  # records per step of the record sizes' check: memory stays flat in N
# what any record field's entry may be (a standard field: its own dtype and shape, fields.py)
_FIELD_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}", re.ASCII)
_FIELD_DTYPES = ("|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8")
_MAX_FIELD_DIMS = 4


@dataclass(frozen=True)
class PackIndex:
    """A validated index: everything a reader needs, and no per-record Python objects.

    ``height``/``width`` are the bound: every record is at most that. ``record_bytes`` is
    ``H * W * C`` when every record is H x W raw (``uniform``: a batch is one gather), else
    None. ``header`` is the .bin's header as ``layout.decode_header`` reads it: every later
    read of the .bin finds it again, or refuses the file.
    """

    json_path: Path
    data_path: Path
    header: dict[str, Any]  # the .bin's, as layout.decode_header reads it
    record_bytes: int | None
    sections: dict[str, layout.Section]
    fields: dict[str, layout.RecordField]
    raw: dict[str, Any] = field(repr=False)  # the index as read: every rule above holds
    # per-record arrays computed on first use; never pickled (a DataLoader worker that
    # needs them reads them again), so no state that travels grows with the record count
    _cache: dict[str, np.ndarray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": {}}

    # what the header and the index agree on (read_index checks)
    count = property(lambda self: self.header["count"])
    height = property(lambda self: self.header["height"])  # the bound
    width = property(lambda self: self.header["width"])
    channels = property(lambda self: self.header["channels"])
    codec = property(lambda self: self.header["codec"])
    version = property(lambda self: self.header["format_version"])
    data_offset = property(lambda self: self.header["data_offset"])
    pack_id = property(lambda self: self.header["pack_id"])  # 32 hex digits
    # what the index alone says
    data_file_bytes = property(lambda self: self.raw["data_file_bytes"])
    classes = property(lambda self: tuple(self.raw["classes"]))
    mean = property(lambda self: tuple(map(float, self.raw["stats"]["mean"])))
    std = property(lambda self: tuple(map(float, self.raw["stats"]["std"])))
    # jpeg: the quality its records were encoded at; None for the other codecs
    quality = property(lambda self: self.raw["jpeg"]["quality"] if self.codec == "jpeg" else None)

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
    def record_offsets(self) -> np.ndarray:
        """Where record i starts, relative to ``data_offset``: int64 (N + 1,), read-only;
        the last entry is the pixels section's size (``layout.record_offsets``)."""

        def offsets() -> np.ndarray:
            lengths = self.read_field(RECORD_LENGTH) if self.codec == "jpeg" else None
            return layout.record_offsets(self.codec, self.record_sizes, self.channels, lengths)

        return self._cached("offsets", offsets)

    @property
    def record_lengths(self) -> np.ndarray:
        """Bytes of every record as stored, int64 (N,), read-only (jpeg: ``record_length``)."""
        return self._cached("lengths", lambda: np.diff(self.record_offsets))

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
        self.check_header(f.read(layout.HEADER_BYTES), os.fstat(f.fileno()).st_size)

    def check_header(self, raw: bytes, size: int) -> None:
        """Refuse header bytes ``raw`` of a ``size``-byte .bin unless they are this pack's
        own: ``PackChangedError``, naming the file."""
        name = self.data_path.name
        try:
            head = layout.decode_header(bytes(raw), name=name)
        except FormatError:
            head = None
        if size != self.data_file_bytes or head != self.header:
            found = "no pack" if head is None else f"pack id {head['pack_id']}"
            raise PackChangedError(
                f"{name}: the pack changed on disk since it was opened "
                f"(id {self.pack_id}, {self.data_file_bytes} bytes; now {found}, {size} bytes);"
                f" reopen the dataset"
            )

    def _read(self, *ranges: layout.Section) -> list[bytes]:
        """The bytes of each range, with one open and one identity check of the .bin."""
        with open(self.data_path, "rb") as f:
            self.check_same_pack(f)
            return _read_ranges(f, ranges, self.data_path.name)

    def read_section(self, name: str) -> np.ndarray:
        """Read section ``name`` from the .bin into memory (for small sections)."""
        s = self.sections[name]
        return np.frombuffer(self._read(s)[0], dtype=s.dtype)

    def read_field(self, name: str) -> np.ndarray | None:
        """Record field ``name`` as a read-only (count, *shape) array; None if absent."""
        f = self.fields.get(name)
        if f is None:
            return None
        return np.frombuffer(self._read(f)[0], dtype=f.dtype).reshape(self.count, *f.shape)

    def geometry(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source_sizes int64 (N, 2), source_boxes f32 (N, 4), content_boxes f32 (N, 4)),
        read-only. A geometry field the pack lacks means "each record is its whole
        source": the source size is the record's own and both boxes the whole record."""
        own = self.record_sizes
        whole = np.concatenate([np.zeros_like(own), own], axis=1).astype(np.float32)
        out = []
        for key, fallback in zip(fields.GEOMETRY_FIELDS, (own, whole, whole)):
            found = self.read_field(key)
            array = fallback if found is None else found.astype(fallback.dtype)
            array.flags.writeable = False
            out.append(array)
        return tuple(out)

    def target_vectors(self) -> np.ndarray | None:
        """The per-record target vectors, float32 (N, K), read-only; None when the pack has none."""
        return self.read_field("targets")

    def source_path(self, i: int, path_offsets: np.ndarray, paths: np.ndarray) -> str:
        """Record ``i``'s source path relative to SRC, from the two path sections."""
        return bytes(paths[int(path_offsets[i]) : int(path_offsets[i + 1])]).decode("utf-8")


def read_index(path: str | os.PathLike) -> PackIndex:
    """Parse and validate a pack's index against its .bin; raise FormatError on any doubt.

    ``path`` may name the .json or the .bin. Costs one JSON parse, one header read and
    one pass over the labels and record sizes (jpeg: and lengths), as numpy arrays: no
    Python object per record.
    """
    json_path, asked_bin = layout.pack_paths(path)
    name = json_path.name
    missing = f"{json_path}: index not found (a pack is NAME.bin plus NAME.json)"
    raw = load_json(json_path, FormatError, what="index", missing=missing)
    if _require(raw, "format", str, name) != layout.FORMAT_NAME:
        raise FormatError(f"{name}: format is {raw['format']!r}, expected {layout.FORMAT_NAME!r}")
    version = _require(raw, "format_version", int, name)
    if version in layout.PRE_RELEASE_VERSIONS:
        raise FormatError(
            f"{name}: format version {version} was a pre-release format; repack it with pack-images"
        )
    if version not in layout.SUPPORTED_VERSIONS:
        raise FormatError(
            f"{name}: format_version {version} is not supported (this imgpack reads "
            f"{', '.join(map(str, layout.SUPPORTED_VERSIONS))}); upgrade imgpack"
        )
    for key, kind in _REQUIRED.items():
        _require(raw, key, kind, name)
    count, shape, codec = raw["count"], raw["shape"], raw["codec"]
    if not is_int_list(shape, 3, minimum=1) or shape[2] not in layout.CHANNEL_COUNTS:
        raise FormatError(f"{name}: shape {shape} is not [height, width, 1 or 3]")
    if raw["dtype"] != "uint8" or raw["layout"] != "HWC":
        raise FormatError(
            f"{name}: dtype/layout {raw['dtype']}/{raw['layout']} unsupported, expected uint8/HWC"
        )
    h, w, c = shape
    if codec not in layout.CODECS:
        raise FormatError(
            f"{name}: codec is {codec!r}, expected one of {', '.join(layout.CODECS)}"
            f" (packed by a newer imgpack? upgrade imgpack)"
        )
    if codec == "yuv420" and c != 3:
        raise FormatError(f"{name}: codec yuv420 stores 3 channels, shape says {c}")
    sections = parse_sections(raw, name)
    record_fields = _fields(raw["fields"], count, name)
    _codec_fields(raw, record_fields, name)
    pack_id = raw["pack_id"]
    if not _PACK_ID.fullmatch(pack_id):
        raise FormatError(f"{name}: pack_id {pack_id!r} is not 32 lowercase hex digits")
    _check_places(raw, {**sections, **record_fields}, name)

    file_name = raw["data_file"]  # a plain name, valid Unicode (no lone surrogate: "\ud800")
    odd = any(ch in "/\\\x00" or "\ud800" <= ch <= "\udfff" for ch in file_name)
    if odd or file_name in ("", ".", "..") or Path(file_name).name != file_name:
        raise FormatError(
            f"{name}: data_file {file_name!r} is not a file name in the index's own folder"
        )
    data_path = json_path.parent / file_name
    if Path(path).suffix != ".json" and asked_bin.name != data_path.name:
        # Renamed packs: never read another .bin than the one the caller named.
        raise FormatError(
            f"{name}: index names data file {data_path.name!r}, but {asked_bin.name!r} was opened;"
            f" rename the files back or fix 'data_file'"
        )
    header = {k: raw[k] for k in ("format_version", "data_offset", "count")}
    header.update(pixels_nbytes=sections["pixels"].nbytes, codec=codec, height=h, width=w)
    header.update(channels=c, pack_id=pack_id)  # the pack id last (_read_data_file)
    po = sections["path_offsets"]
    ranges = [sections["labels"], layout.Section(po.offset, 8, po.dtype)]
    ranges += [layout.Section(po.end - 8, 8, po.dtype), record_fields[RECORD_SIZE]]
    ranges += [record_fields[RECORD_LENGTH]] if codec == "jpeg" else []
    labels, first, last, *records = _read_data_file(
        data_path, raw["data_file_bytes"], header, ranges, name
    )

    classes = raw["classes"]
    if not is_str_list(classes):
        raise FormatError(f"{name}: classes must be a list of strings")
    if len(set(classes)) != len(classes):
        raise FormatError(f"{name}: classes {classes} name the same class twice")
    checksum = raw["checksum"]
    if checksum.get("algorithm") != "crc32" or checksum.get("unit") != "record":
        raise FormatError(f"{name}: checksum {checksum} unsupported, expected crc32 per record")
    sizes, *lengths = (
        np.frombuffer(b, dtype=f.dtype).reshape(count, *f.shape)
        for b, f in zip(records, ranges[3:])
    )
    pixels, uniform = _check_records(sizes, lengths, shape, codec, sections["pixels"].nbytes, name)
    _check_stats(raw["stats"], pixels, c, name)
    labels, k = np.frombuffer(labels, dtype=sections["labels"].dtype), len(classes)
    low, high = (0, k - 1) if k else (-1, -1)  # an unlabelled pack (no classes): every one -1
    if len(labels) and (labels.min() < low or labels.max() > high):
        i = int(np.flatnonzero((labels < low) | (labels > high))[0])
        expected = f"0..{high} ({k} classes)" if k else "-1 (the pack has no classes)"
        raise FormatError(f"{name}: record {i} has label {labels[i]}, expected {expected}")
    first, last = (int.from_bytes(b, "little") for b in (first, last))
    if first != 0 or last != sections["paths"].nbytes:
        raise FormatError(
            f"{name}: path offsets run {first}..{last}, "
            f"the paths section has {sections['paths'].nbytes} bytes"
        )
    record_bytes = h * w * c if uniform else None
    return PackIndex(json_path, data_path, header, record_bytes, sections, record_fields, raw)


def _require(raw: dict[str, Any], key: str, kind: type, name: str) -> Any:
    """``raw[key]``: present, of JSON type ``kind`` (a bool is not an int), an int never
    negative."""
    if key not in raw:
        raise FormatError(f"{name}: missing required field {key!r}")
    value = raw[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise FormatError(
            f"{name}: field {key!r} should be {kind.__name__}, found {type(value).__name__}"
        )
    if kind is int and value < 0:
        raise FormatError(f"{name}: field {key!r} is negative ({value})")
    return value


def _place(entry: dict[str, Any], what: str) -> tuple[int, int]:
    """(offset, nbytes) of a section or field entry: two ints, neither negative."""
    for key in ("offset", "nbytes"):
        if not is_count(entry.get(key)):
            raise FormatError(f"{what} has bad {key} {entry.get(key)!r}")
    return entry["offset"], entry["nbytes"]


def parse_sections(raw: dict[str, Any], name: str) -> dict[str, layout.Section]:
    """The five base sections, each with its standard dtype; those per record exactly as
    many bytes as ``count`` implies (the pixels: ``_check_records``)."""
    count, sections = raw["count"], {}
    implied = layout.layout_sections(count, 0, 0)
    for key, dtype in layout.SECTION_DTYPES.items():
        entry, what = raw["sections"].get(key), f"{name}: section {key!r}"
        if not isinstance(entry, dict):
            raise FormatError(f"{name}: missing section {key!r}")
        offset, nbytes = _place(entry, what)
        if entry.get("dtype") != dtype:
            raise FormatError(f"{what} dtype is {entry.get('dtype')!r}, expected {dtype!r}")
        # the pixels and the paths are bytes, any length; the others are whole by their count
        need = implied[key].nbytes
        if key not in ("pixels", "paths") and nbytes != need:
            raise FormatError(f"{what} has {nbytes} bytes, {count} records need {need}")
        sections[key] = layout.Section(offset, nbytes, dtype)
    return sections


def _fields(entries: dict[str, Any], count: int, name: str) -> dict[str, layout.RecordField]:
    """Every entry of ``fields``, checked; unknown required ones refused ("upgrade imgpack")."""
    out = {}
    for key, entry in entries.items():
        what = f"{name}: record field {key!r}"
        if not _FIELD_NAME.fullmatch(key):
            raise FormatError(
                f"{what}: a name is 1-64 lowercase letters, digits or '_', starting with a letter"
            )
        if not isinstance(entry, dict):
            raise FormatError(f"{what} should be an object, found {type(entry).__name__}")
        required = entry.get("required")
        if not isinstance(required, bool):
            raise FormatError(f"{what} needs 'required' true or false, found {required!r}")
        spec = fields.RECORD_FIELDS.get(key)
        if spec is None and required:
            raise FormatError(
                f"{what} is required to read this pack, and this imgpack does not know it;"
                f" upgrade imgpack"
            )
        offset, nbytes = _place(entry, what)
        dtype, shape = entry.get("dtype"), entry.get("shape")
        if dtype not in _FIELD_DTYPES:
            raise FormatError(
                f"{what} has dtype {dtype!r}, expected one of {', '.join(_FIELD_DTYPES)}"
            )
        if not is_int_list(shape, minimum=1) or len(shape) > _MAX_FIELD_DIMS:
            raise FormatError(
                f"{what} has shape {shape!r}, expected a list of at most "
                f"{_MAX_FIELD_DIMS} positive ints"
            )
        if spec is not None:  # a standard field: its dtype, and its shape (None: any length K)
            like = [s if d is None else d for d, s in zip(spec.shape, shape)]
            if dtype != spec.dtype or len(shape) != len(spec.shape) or shape != like:
                fixed = [d if d is not None else "K" for d in spec.shape]
                raise FormatError(f"{what} is {dtype} {shape}, expected {spec.dtype} {fixed}")
        need = count * math.prod(shape) * np.dtype(dtype).itemsize
        if nbytes != need:
            raise FormatError(
                f"{what} has {nbytes} bytes, {count} records of {dtype} {shape} need {need}"
            )
        out[key] = layout.RecordField(offset, nbytes, dtype, tuple(shape), required)
    return out


def _codec_fields(raw: dict[str, Any], found: dict[str, Any], name: str) -> None:
    """``record_size`` in every pack and ``record_length`` in every jpeg pack (a jpeg
    record's bytes do not follow from its size), each marked required, ``record_length``
    in no other; a jpeg pack's ``jpeg`` object: its quality (1..100), chroma
    subsampling (a string) and records stored as they came (0..count)."""
    codec = raw["codec"]
    for key, needed in ((RECORD_SIZE, True), (RECORD_LENGTH, codec == "jpeg")):
        f = found.get(key)
        if needed and f is None:
            jpeg = " (codec jpeg)" if key == RECORD_LENGTH else ""
            raise FormatError(f"{name}: missing record field {key!r}{jpeg}")
        if needed and not f.required:
            raise FormatError(f"{name}: record field {key!r} is marked optional; it is required")
        if not needed and f is not None:
            raise FormatError(
                f"{name}: record field {key!r} is the jpeg codec's, this pack is {codec}"
            )
    if codec != "jpeg":
        return
    obj, count = _require(raw, "jpeg", dict, name), raw["count"]
    for key, ok, expected in (
        ("quality", lambda q: is_count(q) and 1 <= q <= 100, "an int 1..100"),
        ("subsampling", lambda s: isinstance(s, str), "a string"),
        ("stored_as_is", lambda n: is_count(n) and n <= count, f"an int 0..{count}"),
    ):
        if not ok(obj.get(key)):
            raise FormatError(f"{name}: jpeg.{key} is {obj.get(key)!r}, expected {expected}")


def _check_places(raw: dict[str, Any], places: dict[str, layout.Section], name: str) -> None:
    """Pixels at data_offset, every section and field aligned, none overlapping the header
    or another, the last ending where the file does."""
    pixels = places["pixels"]
    if pixels.offset != raw["data_offset"]:
        raise FormatError(
            f"{name}: pixels start at {pixels.offset}, data_offset says {raw['data_offset']}"
        )
    before, at = "the header", layout.HEADER_BYTES  # the place before, and where it ends
    for key, s in sorted(places.items(), key=lambda kv: (kv[1].offset, kv[1].end)):
        if s.offset % layout.SECTION_ALIGN:
            raise FormatError(
                f"{name}: section {key!r} starts at {s.offset}, "
                f"not a multiple of {layout.SECTION_ALIGN}"
            )
        if s.offset < at:
            raise FormatError(f"{name}: section {key!r} overlaps {before}")
        before, at = f"section {key!r}", s.end
    end = max(s.end for s in places.values())
    if end != raw["data_file_bytes"]:
        raise FormatError(
            f"{name}: sections end at {end}, data_file_bytes says {raw['data_file_bytes']}"
        )


def _read_ranges(f: IO[bytes], ranges: Sequence[layout.Section], name: str) -> list[bytes]:
    """The bytes of each range of the open file ``f``; a file that ends early is refused."""
    out = []
    for r in ranges:
        f.seek(r.offset)
        out.append(f.read(r.nbytes))
        if len(out[-1]) != r.nbytes:
            raise FormatError(f"{name}: file ends early (changed while read?)")
    return out


def _read_data_file(path: Path, size: int, header: dict, ranges: list, name: str) -> list[bytes]:
    """The .bin is there, of the index's size, with the header ``header``; the bytes of
    ``ranges``, read with the same open."""
    bin_name = path.name
    try:
        actual = path.stat().st_size
        if actual != size:
            raise FormatError(
                f"{bin_name}: file has {actual} bytes, index says {size}"
                + (" (truncated?)" if actual < size else "")
            )
        with open(path, "rb") as f:
            head = layout.decode_header(f.read(layout.HEADER_BYTES), name=bin_name)
            for key, want in header.items():  # the pack id last: the rest says more
                if head[key] != want:
                    other = " (the .bin and the .json are from different packs)"
                    raise FormatError(
                        f"{bin_name}: header {key} is {head[key]}, index says {want}"
                        + (other if key == "pack_id" else "")
                    )
            return _read_ranges(f, ranges, bin_name)
    except FileNotFoundError:
        raise FormatError(f"{name}: data file {bin_name} not found beside the index") from None
    except OSError as e:
        raise FormatError(f"{name}: cannot read data file {bin_name} ({e.strerror or e})") from None


def _check_records(sizes: np.ndarray, lengths: list, shape: list, codec: str, end: int, name: str):
    """Every record within the bound, and the records end where the pixels section does.

    ``sizes`` is the (N, 2) ``record_size`` field, (width, height), as read; ``lengths``
    holds the (N, 1) ``record_length`` field of a jpeg pack (each at least 2 bytes, SOI);
    ``end`` is the pixels section's size.
    Returns the pixels (per channel) the records hold, and whether every record is the
    bound's size and raw (``PackIndex.uniform``). Walks the sizes in chunks.
    """
    h, w, c = shape
    n = len(sizes)
    most = _MAX_LENGTH if codec == "jpeg" else layout.record_nbytes(codec, w, h, c)
    if most * n >= _MAX_PIXELS_NBYTES:
        raise FormatError(
            f"{name}: {n} records of up to {most} bytes each could need 2**63 bytes or more"
        )
    at = pixels = 0
    uniform = codec == "raw"
    for a in range(0, n, _CHUNK):
        part = sizes[a : a + _CHUNK].astype(np.int64)
        rw, rh = part[:, 0], part[:, 1]
        bad = (rw < 1) | (rw > w) | (rh < 1) | (rh > h)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise FormatError(
                f"{name}: record {a + i} is {rw[i]}x{rh[i]} (record_size, width x height), "
                f"outside the bound 1..{w} x 1..{h}"
            )
        stored = lengths[0][a : a + _CHUNK].reshape(-1) if lengths else None  # jpeg's
        if stored is not None and (stored < _MIN_JPEG).any():
            i = int(np.flatnonzero(stored < _MIN_JPEG)[0])
            raise FormatError(
                f"{name}: record {a + i} has record_length {stored[i]}, "
                f"a JPEG stream has at least {_MIN_JPEG} bytes (SOI)"
            )
        at += int(layout.record_offsets(codec, part, c, stored)[-1])  # the one rule
        pixels += int((rw * rh).sum())
        uniform = uniform and bool(((rw == w) & (rh == h)).all())
    if at != end:
        whence = "lengths from record_length" if codec == "jpeg" else "sizes from record_size"
        raise FormatError(
            f"{name}: the {n} records ({codec}, {whence}) end at {at} bytes, "
            f"the pixels section has {end}"
        )
    return pixels, uniform


def _check_stats(stats: dict[str, Any], pixels: int, channels: int, name: str) -> None:
    """mean/std for the reader, plus the exact sums that let shards be merged; ``pixels``
    is how many pixels (per channel) the records hold, the sum of their width x height."""
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
        if not all(abs(x) <= sys.float_info.max for x in stats[key]):  # ints too, exactly
            raise FormatError(f"{name}: stats.{key} {stats[key]} are not finite")
    for c, (total, squares) in enumerate(zip(stats["sum"], stats["sum_sq"])):
        if not sums_possible(pixels, [total], [squares]):
            raise FormatError(
                f"{name}: stats.sum/sum_sq of channel {c} ({total}, {squares}) are not sums "
                f"of {pixels} uint8 values"
            )
