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
from functools import cached_property
from pathlib import Path
from typing import IO, Any

import numpy as np

from imgpack.errors import FormatError, PackChangedError
from imgpack.format import fields, layout
from imgpack.format.fields import RECORD_LENGTH, RECORD_SIZE
from imgpack.format.write import sums_possible
from imgpack.validate import check_rules, is_count, is_int, is_int_list, is_str_list, load_json

__all__ = ["PackIndex", "read_index", "parse_sections"]

# every top-level field an index must hold, by JSON type: (the test, its words, the fields);
# an int is a count (never a bool, never negative). The jpeg object of a jpeg pack is
# checked with the codec's fields.
_JSON_TYPES = [
    (lambda v: isinstance(v, str), "a string", "format data_file dtype layout codec pack_id"),
    (is_count, "an int >= 0", "format_version data_file_bytes count data_offset"),
    (lambda v: isinstance(v, list), "a list", "shape classes skipped"),
    (lambda v: isinstance(v, dict), "an object", "sections fields checksum stats packer"),
]
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

    def __getstate__(self) -> dict[str, Any]:
        # the per-record arrays, computed on first use, are never pickled (a DataLoader
        # worker that needs them reads them again): no state that travels grows with N
        return {k: v for k, v in self.__dict__.items() if k not in _PER_RECORD}

    # what the header and the index agree on (read_index checks)
    count = property(lambda self: self.header["count"])
    height = property(lambda self: self.header["height"])  # the bound
    width = property(lambda self: self.header["width"])
    channels = property(lambda self: self.header["channels"])
    codec = property(lambda self: self.header["codec"])
    data_offset = property(lambda self: self.header["data_offset"])
    pack_id = property(lambda self: self.header["pack_id"])  # 32 hex digits
    # what the index alone says
    data_file_bytes = property(lambda self: self.raw["data_file_bytes"])
    classes = property(lambda self: tuple(self.raw["classes"]))
    mean = property(lambda self: tuple(map(float, self.raw["stats"]["mean"])))
    std = property(lambda self: tuple(map(float, self.raw["stats"]["std"])))
    # jpeg: the quality its records were encoded at; None for the other codecs
    quality = property(lambda self: self.raw["jpeg"]["quality"] if self.codec == "jpeg" else None)

    shape = property(lambda self: (self.height, self.width, self.channels))
    # every record is H x W and raw: record i at ``data_offset + i * record_bytes``
    uniform = property(lambda self: self.record_bytes is not None)

    @cached_property
    def record_sizes(self) -> np.ndarray:
        """(width, height) of every record, int64 (N, 2), read-only: the ``record_size``
        field, read from the .bin when first asked for."""
        return _read_only(self.read_field(RECORD_SIZE).astype(np.int64))

    @cached_property
    def record_offsets(self) -> np.ndarray:
        """Where record i starts, relative to ``data_offset``: int64 (N + 1,), read-only;
        the last entry is the pixels section's size (``layout.record_offsets``)."""
        lengths = self.read_field(RECORD_LENGTH)  # jpeg's (None in the other codecs' packs)
        offsets = layout.record_offsets(self.codec, self.record_sizes, self.channels, lengths)
        return _read_only(offsets)

    @cached_property
    def record_lengths(self) -> np.ndarray:
        """Bytes of every record as stored, int64 (N,), read-only (jpeg: ``record_length``)."""
        return _read_only(np.diff(self.record_offsets))

    def section_array(self, name: str, buffer: Any) -> np.ndarray:
        """A zero-copy numpy view of section ``name`` inside ``buffer`` (a mmap or bytes)."""
        s = self.sections[name]
        count = s.nbytes // np.dtype(s.dtype).itemsize
        return np.frombuffer(buffer, dtype=s.dtype, count=count, offset=s.offset)

    def check_same_pack(self, f: IO[bytes]) -> None:
        """Refuse a .bin (open as ``f``) that is no longer the file this index was read from."""
        f.seek(0)
        self.check_header(f.read(layout.HEADER_BYTES), os.fstat(f.fileno()).st_size)

    def check_header(self, raw: bytes, size: int) -> None:
        """Refuse header bytes ``raw`` of a ``size``-byte .bin unless they are this pack's
        own: ``PackChangedError``, naming the file (a plain ``FormatError`` when it holds no
        imgpack header at all: damage, not another pack)."""
        name = self.data_path.name
        why = _differs(raw, size, self.header, self.data_file_bytes, name)
        if why is not None:
            raise PackChangedError(
                f"{name}: the pack changed on disk since it was opened ({why}); reopen the dataset"
            )

    def _read(self, place: layout.Section) -> np.ndarray:
        """The flat read-only array at ``place``, with one open and identity check of the .bin."""
        with open(self.data_path, "rb") as f:
            self.check_same_pack(f)
            return _read_ranges(f, [place], self.data_path.name)[0]

    def read_section(self, name: str) -> np.ndarray:
        """Read section ``name`` from the .bin into memory (for small sections)."""
        return self._read(self.sections[name])

    def read_field(self, name: str) -> np.ndarray | None:
        """Record field ``name`` as a read-only (count, *shape) array; None if absent."""
        f = self.fields.get(name)
        return None if f is None else self._read(f).reshape(self.count, *f.shape)

    def geometry(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source_sizes int64 (N, 2), source_boxes f32 (N, 4), content_boxes f32 (N, 4)),
        read-only. A geometry field the pack lacks means "each record is its whole
        source": the source size is the record's own and both boxes the whole record."""
        own = self.record_sizes
        whole = np.concatenate([np.zeros_like(own), own], axis=1).astype(np.float32)
        out = []
        for key, fallback in zip(fields.GEOMETRY_FIELDS, (own, whole, whole)):
            found = self.read_field(key)
            out.append(_read_only(fallback if found is None else found.astype(fallback.dtype)))
        return tuple(out)

    def target_vectors(self) -> np.ndarray | None:
        """The per-record target vectors, float32 (N, K), read-only; None when the pack has none."""
        return self.read_field("targets")

    def source_path(self, i: int, path_offsets: np.ndarray, paths: np.ndarray) -> str:
        """Record ``i``'s source path relative to SRC, from the two path sections."""
        return bytes(paths[int(path_offsets[i]) : int(path_offsets[i + 1])]).decode("utf-8")


_PER_RECORD = ("record_sizes", "record_offsets", "record_lengths")  # PackIndex's cached


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def read_index(path: str | os.PathLike) -> PackIndex:
    """Parse and validate a pack's index against its .bin; raise FormatError on any doubt.

    ``path`` may name the .json or the .bin. Costs one JSON parse, one header read and
    one pass over the labels and record sizes (jpeg: and lengths), as numpy arrays: no
    Python object per record.
    """
    json_path, asked_bin = layout.pack_paths(path)
    name = json_path.name
    missing = f"{json_path}: index not found (a pack is NAME.bin plus NAME.json)"
    raw = load_json(json_path, what="index", missing=missing)
    check_rules(raw, _FORMAT, f"{name}: ")
    version = raw["format_version"]
    if version in layout.PRE_RELEASE_VERSIONS:
        raise FormatError(
            f"{name}: format version {version} was a pre-release format; repack it with pack-images"
        )
    if version not in layout.SUPPORTED_VERSIONS:
        raise FormatError(
            f"{name}: format_version {version} is not supported (this imgpack reads "
            f"{', '.join(map(str, layout.SUPPORTED_VERSIONS))}); upgrade imgpack"
        )
    count, codec = raw.get("count"), raw.get("codec")
    yuv = ("shape", lambda v: codec != "yuv420" or v[2] == 3, "3 channels (codec yuv420)")
    jpeg = ("jpeg", lambda v: codec != "jpeg" or isinstance(v, dict), "an object (codec jpeg)")
    check_rules(raw, [*_TYPED, *_TOP_LEVEL, yuv, jpeg], f"{name}: ")
    sections = parse_sections(raw, name)
    record_fields = _fields(raw["fields"], count, codec, name)
    if codec == "jpeg":
        as_is = ("stored_as_is", lambda n: is_count(n) and n <= count, f"an int 0..{count}")
        check_rules(raw["jpeg"], [*_JPEG, as_is], f"{name}: jpeg.")
    _check_places(raw, {**sections, **record_fields}, name)
    data_path = json_path.parent / raw["data_file"]
    if Path(path).suffix != ".json" and asked_bin.name != data_path.name:
        # Renamed packs: never read another .bin than the one the caller named.
        raise FormatError(
            f"{name}: index names data file {data_path.name!r}, but {asked_bin.name!r} was opened;"
            f" rename the files back or fix 'data_file'"
        )
    h, w, c = raw["shape"]
    header = {k: raw[k] for k in ("format_version", "data_offset", "count")}
    header.update(pixels_nbytes=sections["pixels"].nbytes, codec=codec, height=h, width=w)
    header.update(channels=c, pack_id=raw["pack_id"])  # the pack id last: the rest says more
    po = sections["path_offsets"]
    ranges = [sections["labels"], layout.Section(po.offset, 8, po.dtype)]
    ranges += [layout.Section(po.end - 8, 8, po.dtype), record_fields[RECORD_SIZE]]
    ranges += [record_fields[RECORD_LENGTH]] if codec == "jpeg" else []
    found = _read_data_file(data_path, raw["data_file_bytes"], header, ranges, name)
    labels, (first,), (last,), sizes, *lengths = found
    pixels, uniform = _check_records(sizes, lengths, header, name)
    _check_stats(raw["stats"], pixels, c, name)
    k = len(raw["classes"])
    low, high = (0, k - 1) if k else (-1, -1)  # an unlabelled pack (no classes): every one -1
    if len(labels) and (labels.min() < low or labels.max() > high):
        i = int(np.flatnonzero((labels < low) | (labels > high))[0])
        expected = f"0..{high} ({k} classes)" if k else "-1 (the pack has no classes)"
        raise FormatError(f"{name}: record {i} has label {labels[i]}, expected {expected}")
    if first != 0 or last != sections["paths"].nbytes:
        raise FormatError(
            f"{name}: path offsets run {first}..{last}, "
            f"the paths section has {sections['paths'].nbytes} bytes"
        )
    record_bytes = h * w * c if uniform else None
    return PackIndex(json_path, data_path, header, record_bytes, sections, record_fields, raw)


def _is_file_name(v: str) -> bool:
    """A plain name, valid Unicode (no lone surrogate: "\\ud800"), not a path."""
    odd = any(ch in "/\\\x00" or "\ud800" <= ch <= "\udfff" for ch in v)
    return not odd and v not in ("", ".", "..") and Path(v).name == v


# Each rule: (key, test, what it expects). The index's own values, once each has its JSON
# type, and those of the objects in it (docs/format.md, "Rules for readers").
_NEWER = "(packed by a newer imgpack? upgrade imgpack)"
_UNKNOWN = "false (this imgpack does not know the field: upgrade imgpack)"
_CRC = ("crc32", "record")  # the checksum's algorithm, over what
_FORMAT = [  # asked first: a file that is no index of this format says so, whatever else
    ("format", lambda v: v == layout.FORMAT_NAME, repr(layout.FORMAT_NAME)),
    ("format_version", is_count, "an int >= 0"),
]
_TYPED = [(key, test, words) for test, words, keys in _JSON_TYPES for key in keys.split()]
_TOP_LEVEL = [
    ("shape", lambda v: is_int_list(v, 3, minimum=1), "[height, width, channels], each > 0"),
    ("shape", lambda v: v[2] in layout.CHANNEL_COUNTS, "1 or 3 channels"),
    ("dtype", lambda v: v == "uint8", "'uint8'"),
    ("layout", lambda v: v == "HWC", "'HWC'"),
    ("codec", lambda v: v in layout.CODECS, f"one of {', '.join(layout.CODECS)} {_NEWER}"),
    ("pack_id", _PACK_ID.fullmatch, "32 lowercase hex digits"),
    ("data_file", _is_file_name, "a file name in the index's own folder"),
    ("classes", is_str_list, "a list of strings"),
    ("classes", lambda v: len(set(v)) == len(v), "no name twice"),
    ("checksum", lambda v: (v.get("algorithm"), v.get("unit")) == _CRC, "crc32 per record"),
]
_JPEG = [
    ("quality", lambda q: is_count(q) and 1 <= q <= 100, "an int 1..100"),
    ("subsampling", lambda s: isinstance(s, str), "a string"),
]
_SHAPE = f"a list of 1 to {_MAX_FIELD_DIMS} positive ints"
_ALIGNED = f"an int >= 0, a multiple of {layout.SECTION_ALIGN}"
_PLACE = [
    ("offset", lambda o: is_count(o) and o % layout.SECTION_ALIGN == 0, _ALIGNED),
    ("nbytes", is_count, "an int >= 0"),
]
_FIELD = [
    ("required", lambda v: isinstance(v, bool), "true or false"),
    *_PLACE,
    ("dtype", lambda v: v in _FIELD_DTYPES, f"one of {', '.join(_FIELD_DTYPES)}"),
    ("shape", lambda v: is_int_list(v, minimum=1) and len(v) <= _MAX_FIELD_DIMS, _SHAPE),
]


def parse_sections(raw: dict[str, Any], name: str) -> dict[str, layout.Section]:
    """The five base sections, each with its standard dtype; those per record exactly as
    many bytes as ``count`` implies (the pixels: ``_check_records``)."""
    count, sections = raw["count"], {}
    implied = layout.layout_sections(count, 0, 0)
    for key, dtype in layout.SECTION_DTYPES.items():
        entry = raw["sections"].get(key)
        if not isinstance(entry, dict):
            raise FormatError(f"{name}: missing section {key!r}")
        # the pixels and the paths are bytes, any length; the others are whole by their count
        need = entry.get("nbytes") if key in ("pixels", "paths") else implied[key].nbytes
        whole = ("nbytes", lambda n, need=need: n == need, f"{need}, what {count} records need")
        rules = [*_PLACE, ("dtype", lambda v, dtype=dtype: v == dtype, repr(dtype)), whole]
        check_rules(entry, rules, f"{name}: section {key!r} ")
        sections[key] = layout.Section(entry["offset"], entry["nbytes"], dtype)
    return sections


def _fields(entries: dict[str, Any], count: int, codec: str, name: str) -> dict[str, Any]:
    """Every entry of ``fields``, checked (``_standard``); the codec's own fields present."""
    out = {}
    for key, entry in entries.items():
        what = f"{name}: record field {key!r}"
        if not _FIELD_NAME.fullmatch(key):
            raise FormatError(
                f"{what}: a name is 1-64 lowercase letters, digits or '_', starting with a letter"
            )
        if not isinstance(entry, dict):
            raise FormatError(f"{what} is {entry!r}, expected an object")
        check_rules(entry, [*_FIELD, *_standard(key, codec)], f"{what} ")
        dtype, shape = entry["dtype"], tuple(entry["shape"])
        need = count * math.prod(shape) * np.dtype(dtype).itemsize
        whole = ("nbytes", lambda n, need=need: n == need, f"{need}, what {count} records need")
        check_rules(entry, [whole], f"{what} ")
        out[key] = layout.RecordField(entry["offset"], need, dtype, shape, entry["required"])
    for key, spec in fields.RECORD_FIELDS.items():  # a codec's own: in its packs, only there
        if spec.codecs and (key in out) != (codec in spec.codecs):
            held = f"in this {codec} pack, expected in {', '.join(spec.codecs)} packs only"
            if key not in out:  # (the message says which packs need it, not where it may be)
                held = f"missing from this {codec} pack ({codec} packs need it)"
            raise FormatError(f"{name}: record field {key!r} is {held}")
    return out


def _standard(key: str, codec: str) -> list[tuple]:
    """The rules of field ``key`` beyond any field's: an unknown one is optional; a standard
    one has its own dtype and shape (None: any length K), and is marked required in the
    packs of its codecs."""
    spec = fields.RECORD_FIELDS.get(key)
    if spec is None:
        return [("required", lambda r: not r, _UNKNOWN)]
    fixed = [d or "K" for d in spec.shape]
    return [
        ("dtype", lambda v: v == spec.dtype, repr(spec.dtype)),
        ("shape", lambda s: _same_shape(spec.shape, s), str(fixed)),
        ("required", lambda r: r or codec not in spec.codecs, f"true: codec {codec} needs it"),
    ]


def _same_shape(standard: tuple, shape: list) -> bool:
    """``shape`` is ``standard``, where a None in ``standard`` stands for any length."""
    return len(shape) == len(standard) and all(d in (None, n) for d, n in zip(standard, shape))


def _check_places(raw: dict[str, Any], places: dict[str, layout.Section], name: str) -> None:
    """No section or field overlaps the header or another; the pixels start at data_offset,
    and the last place ends where the file does."""
    before, at = "the header", layout.HEADER_BYTES  # the place before, and where it ends
    for key, s in sorted(places.items(), key=lambda kv: (kv[1].offset, kv[1].end)):
        if s.offset < at:
            raise FormatError(f"{name}: section {key!r} overlaps {before}")
        before, at = f"section {key!r}", s.end
    start, end = places["pixels"].offset, layout.file_bytes(places)
    rules = [("data_offset", lambda v: v == start, f"{start}, where section 'pixels' starts")]
    rules += [("data_file_bytes", lambda v: v == end, f"{end}, where the last section ends")]
    check_rules(raw, rules, f"{name}: ")


def _read_ranges(f: IO[bytes], ranges: Sequence[layout.Section], name: str) -> list[np.ndarray]:
    """Each range of the open file ``f`` as a flat read-only array of its dtype; a file that
    ends early is refused."""
    out = []
    for r in ranges:
        f.seek(r.offset)
        out.append(f.read(r.nbytes))
        if len(out[-1]) != r.nbytes:
            raise FormatError(f"{name}: file ends early (changed while read?)")
    return [np.frombuffer(b, dtype=r.dtype) for b, r in zip(out, ranges)]


def _differs(raw: bytes, size: int, header: dict, nbytes: int, name: str) -> str | None:
    """How a .bin of ``size`` bytes that starts with ``raw`` differs from the one its index
    describes (``header``, ``nbytes`` bytes), in words; None where it does not. A file with
    no imgpack header is a FormatError (``layout.decode_header``)."""
    if size != nbytes:
        short = " (truncated?)" if size < nbytes else ""
        return f"file has {size} bytes, index says {nbytes}{short}"
    head = layout.decode_header(bytes(raw), name=name)
    for key, want in header.items():  # the pack id last: the rest says more
        if head[key] != want:
            other = " (the .bin and the .json are from different packs)" if key == "pack_id" else ""
            return f"header {key} is {head[key]}, index says {want}{other}"
    return None


def _read_data_file(path: Path, size: int, header: dict, ranges: list, name: str) -> list:
    """The .bin is there, of the index's size, with the header ``header``; the arrays at
    ``ranges`` (``_read_ranges``), read with the same open."""
    bin_name = path.name
    try:
        with open(path, "rb") as f:
            raw, actual = f.read(layout.HEADER_BYTES), os.fstat(f.fileno()).st_size
            why = _differs(raw, actual, header, size, bin_name)
            if why is not None:
                raise FormatError(f"{bin_name}: {why}")
            return _read_ranges(f, ranges, bin_name)
    except FileNotFoundError:
        raise FormatError(f"{name}: data file {bin_name} not found beside the index") from None
    except OSError as e:
        raise FormatError(f"{name}: cannot read data file {bin_name} ({e.strerror or e})") from None


def _check_records(sizes: np.ndarray, lengths: list, header: dict, name: str):
    """Every record within the bound, and the records end where the pixels section does.

    ``sizes`` is the ``record_size`` field, (width, height) per record, as read (flat);
    ``lengths`` holds the ``record_length`` field of a jpeg pack (each at least 2 bytes, SOI);
    ``header`` holds the bound, channels, codec and the pixels section's size.
    Returns the pixels (per channel) the records hold, and whether every record is the
    bound's size and raw (``PackIndex.uniform``). Walks the sizes in chunks.
    """
    h, w, c, codec = (header[k] for k in ("height", "width", "channels", "codec"))
    sizes = sizes.reshape(-1, 2)
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
        stored = lengths[0][a : a + _CHUNK] if lengths else None  # jpeg's
        if stored is not None and (stored < _MIN_JPEG).any():
            i = int(np.flatnonzero(stored < _MIN_JPEG)[0])
            raise FormatError(
                f"{name}: record {a + i} has record_length {stored[i]}, "
                f"a JPEG stream has at least {_MIN_JPEG} bytes (SOI)"
            )
        at += int(layout.record_offsets(codec, part, c, stored)[-1])  # the one rule
        pixels += int((rw * rh).sum())
        uniform = uniform and bool(((rw == w) & (rh == h)).all())
    if at != header["pixels_nbytes"]:
        whence = "lengths from record_length" if codec == "jpeg" else "sizes from record_size"
        raise FormatError(
            f"{name}: the {n} records ({codec}, {whence}) end at {at} bytes, "
            f"the pixels section has {header['pixels_nbytes']}"
        )
    return pixels, uniform


def _check_stats(stats: dict[str, Any], pixels: int, channels: int, name: str) -> None:
    """mean/std for the reader, plus the exact sums that let shards be merged; ``pixels``
    is how many pixels (per channel) the records hold, the sum of their width x height."""

    def each(ok: Any) -> Any:
        return lambda v: isinstance(v, list) and len(v) == channels and all(map(ok, v))

    def finite(x: Any) -> bool:
        return (is_int(x) or isinstance(x, float)) and abs(x) <= sys.float_info.max  # ints exactly

    sums = f"the sums of {pixels} uint8 values per channel, with sum_sq {stats.get('sum_sq')}"
    rules = [(key, each(finite), f"{channels} finite numbers") for key in ("mean", "std")]
    rules += [(key, each(is_int), f"{channels} ints") for key in ("sum", "sum_sq")]
    rules += [("pixels", lambda n: is_int(n) and n == pixels, f"{pixels}, the records' w x h")]
    rules += [("sum", lambda s: sums_possible(pixels, s, stats["sum_sq"]), sums)]
    check_rules(stats, rules, f"{name}: stats.")
