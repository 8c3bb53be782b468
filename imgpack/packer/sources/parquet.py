"""Parquet files as a source, in the layout the Hugging Face Hub ships image datasets in.

One row per image: an image column (``struct<bytes: binary, path: string>``, what the
``datasets`` library writes for an ``Image`` feature, or a plain binary column) and an
integer ``label`` column, whose class names the file's schema metadata carries under the
key ``huggingface``: ``{"info": {"features": {"label": {"_type": "ClassLabel", "names":
[...]}}}}``. Listing reads the label column only (and each file's footer, whose digest pins
the file for a rerun). Packing reads the image column row group by row group, never a whole
file, nor ever extracted: a decoding process reads a row group whole (its rows are ``Part``
payloads of one unit) and keeps it, as Arrow holds it, while it decodes the rows it was
handed, copying out one image at a time; so the parent reads no image and every core
shares the reading. A process holds at most one row group's image column, at most
``_UNIT_BYTES`` (uncompressed, as the file's metadata gives it), read through a small
buffer. It reads the row group once for each chunk of its rows it is handed: once, where
the run's chunks hold whole row groups (``parallel.ParallelDecoder`` never lets one chunk
straddle two); a run that cuts a row group into several chunks (records of more than 32 MB
at the run's size, or a run small enough that every process gets 4 chunks) may read it once
per chunk. A row group too large to hand one process (``_UNIT_ROWS``, ``_UNIT_BYTES``; the
Hub writes 100 images a row group, pandas up to a million rows) is read by the parent
instead, ``_BATCH_ROWS`` rows at a time, and each row's bytes travel with its chunk. Rows
are named ``file.parquet:row`` (the row's number in its file, from 0).

pyarrow is an optional extra (``imgpack[parquet]``), imported here only, when a Parquet
source is opened; the reader never imports it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from imgpack.errors import MissingExtraError, SourceError
from imgpack.packer.sources.source import Part, Scan, Skip, Source, reading, reason
from imgpack.validate import is_str_list, json_or_none

__all__ = ["ParquetSource", "read_rows"]

_BATCH_ROWS = 64  # rows per read of a large row group: a few MB of images at a time
_UNIT_ROWS = 1024  # a row group of at most this many rows...
_UNIT_BYTES = 64 << 20  # ...and bytes (uncompressed) is read whole by a decoding process
# past the rows a row group gave: fewer rows than the file's metadata says
_GONE = Skip("the row is not in its row group (the file changed since it was listed?)")
_READ_BUFFER = 1 << 20  # bytes pyarrow reads of a column chunk at a time
_IMAGES = "binary, or a struct with a binary 'bytes' field"
_BAD_FILE = (OSError, ValueError)  # what pyarrow raises for a bad file (ArrowInvalid: ValueError)


class ParquetSource(Source):
    """Rows of Parquet ``paths`` (sorted), named ``name:row`` with ``names`` the files'
    names relative to ``root``. ``options``: ``image_column``/``label_column``, None: found
    as the module docstring says; ``label_column`` "none" or ``labelled`` False: no labels.

    A payload is a ``Part`` of its row group (which the decoding process reads whole, once
    per chunk, and keeps: ``__call__``), or, from a row group too large for that, the
    image's bytes, read here."""

    kind = "parquet"
    noun = "Parquet files"
    _rows: _Rows | None = None  # the large row group the parent reads (``payload``)

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.labelled = self.labelled and self.options.get("label_column") != "none"
        self._large: set[tuple[int, int]] = set()  # (file, row group) read by the parent
        for k, path in enumerate(self.paths):  # the first open says if pyarrow is missing
            # the columns found in the first file (a label's None: no labels) are every file's
            with self._open(k) as pf:
                self.options, names = _columns(pf.schema_arrow, self.options, self.labelled, path)
            if names is not None and self.class_names not in (None, names):
                why = f"huggingface metadata of column {self.options['label_column']!r}"
                raise SourceError(f"{path}: its class names differ from {self.paths[0]}'s ({why})")
            self.class_names = names if names is not None else self.class_names

    def _open(self, k: int):
        """File ``k``, open; the first open says which extra installs pyarrow if it is missing."""
        try:
            import pyarrow.parquet as pq
        except ImportError:
            need = "reading Parquet files needs pyarrow: pip install imgpack[parquet]"
            raise MissingExtraError(need) from None
        with reading(self.paths[k], "not a Parquet file", _BAD_FILE):
            return pq.ParquetFile(self.paths[k])

    def scan(self, k: int) -> Scan:
        """File ``k``'s rows, each placed as (row group, row in it), a null label a bad
        row; its row groups too large for a decoding process noted (``_large``)."""
        with self._open(k) as pf:
            places = [np.zeros((0, 2), dtype=np.int64)]  # (row group, row in it) of each row
            for g in range(pf.metadata.num_row_groups):
                meta = pf.metadata.row_group(g)
                if meta.num_rows <= _UNIT_ROWS and meta.total_byte_size <= _UNIT_BYTES:
                    self.unit_size = max(self.unit_size, meta.num_rows)
                else:
                    self._large.add((k, g))
                rows = np.arange(meta.num_rows)
                places.append(np.stack([np.full_like(rows, g), rows], axis=1))
            places = np.concatenate(places)
            labels, bad = np.full(len(places), -1, dtype=np.int64), {}
            if self.options["label_column"] is not None:
                with reading(self.paths[k], "its label column does not read", _BAD_FILE):
                    col = pf.read(columns=[self.options["label_column"]], use_threads=False)[0]
                labels = col.fill_null(-1).to_numpy().astype(np.int64)
                bad = dict.fromkeys(np.flatnonzero(col.is_null()).tolist(), "no label (null)")
        keys = [str(r) for r in range(len(places))]
        return Scan(keys, labels, places, bad, [], 0, _footer_digest(self.paths[k]))

    def payload(self, position: int) -> Part | bytes | Skip:
        """The row as a ``Part`` of its row group, or (a large row group) its image bytes
        read here, ``_BATCH_ROWS`` rows at a time, as ``feed`` asks for rows, in order; from
        where such a read failed, a Skip for every row of its row group."""
        k, group, row = self._places[position].tolist()
        if (k, group) not in self._large:
            return Part((k, group), row)
        if self._rows is None or self._rows.unit != (k, group):
            self._rows = _Rows(self, (k, group), _BATCH_ROWS)
        return self._rows.image(row)

    def __call__(self, payload: Part | bytes) -> bytes | Skip:
        """A ``Part``: its row of the row group this process read whole and keeps, as Arrow
        holds it, until the next one (each image copied out when asked for, so a row group
        held costs no second copy of it as Python bytes); bytes: the image, read by the
        parent from a large row group."""
        if not isinstance(payload, Part):
            return super().__call__(payload)
        if payload.unit not in self._held:  # the last row group goes (_Rows reads lazily)
            self._held = {payload.unit: _Rows(self, payload.unit, _UNIT_ROWS)}
        return self._held[payload.unit].image(payload.index)


class _Rows:
    """The images of one row group of ``source`` (``unit``: (file, row group)), asked for in
    ascending order: its image column is read ``batch`` rows at a time (``read_rows``),
    holding one batch, as Arrow holds it; a read that fails is a Skip for every row not read
    yet."""

    def __init__(self, source: ParquetSource, unit: tuple[int, int], batch: int) -> None:
        self.unit, self.start, self.rows = unit, 0, []  # the batch held, from row ``start``
        path, column = source.paths[unit[0]], source.options["image_column"]
        self.batches = read_rows(path, unit[1], column, batch)

    def image(self, row: int) -> bytes | Skip:
        """Row ``row``'s image bytes, or why there are none (a Skip, once held, stays)."""
        while not isinstance(self.rows, Skip) and row >= self.start + len(self.rows):
            self.start, self.rows = self.start + len(self.rows), next(self.batches, _GONE)
        return self.rows if isinstance(self.rows, Skip) else _image(self.rows, row - self.start)


def read_rows(path: str, group: int, column: str, batch: int) -> Iterator[Any]:
    """One row group's ``column`` as Arrow holds it, ``batch`` rows at a time (pyarrow cuts
    a batch short only at the end: a row group read whole is one batch of ``_UNIT_ROWS``);
    a read that fails ends it with one Skip, for every row it did not give. pyarrow reads
    the column's pages through a small buffer (``_READ_BUFFER``), never the whole column
    chunk at once, with one thread: the decoding processes have every core."""
    import pyarrow.parquet as pq  # installed: the parent opened the file with it

    try:
        with pq.ParquetFile(path, buffer_size=_READ_BUFFER) as pf:
            parts = pf.iter_batches(batch, row_groups=[group], columns=[column], use_threads=False)
            yield from (part.column(0) for part in parts)
    except (*_BAD_FILE, IndexError) as exc:
        yield Skip(f"row group {group} of the file does not read ({reason(exc)})")


def _image(rows, i: int) -> bytes | Skip:
    """Row i's encoded bytes (one copy, of that image only), or why there are none: a
    struct<bytes, path> image may be null at either level."""
    value = rows[i].as_py()
    data, path = (value.get("bytes"), value.get("path")) if isinstance(value, dict) else (value, 0)
    if data is not None:
        return data
    if path:
        return Skip(f"image bytes are null (the row names {path!r}, which is not in the file)")
    return Skip("image is null")


def _footer_digest(path: str) -> str:
    """A digest of a Parquet file's footer: its metadata (schema, every row group's place,
    sizes and statistics) as the file holds it, read in two small reads at its end."""
    with reading(path, "its footer does not read"), open(path, "rb") as f:
        f.seek(-8, os.SEEK_END)  # the footer's length, then b"PAR1"
        f.seek(-8 - int.from_bytes(f.read(4), "little"), os.SEEK_END)
        footer = f.read()
    return hashlib.blake2b(footer, digest_size=16).hexdigest()


# Which columns of a Parquet file hold the images and the labels, and the class names.
#
# The Hub's layout, as the ``datasets`` library writes it: an ``Image`` feature is stored as
# ``struct<bytes: binary, path: string>`` and a ``ClassLabel`` as integers, and the file's
# schema metadata, under the key ``huggingface``, holds the features as JSON
# (``{"info": {"features": {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel",
# "names": [...]}}}}``). Files written by other tools have no such metadata: the columns are
# then found by their types alone, and the classes are numbers.


def _columns(schema, given: dict[str, str], labelled: bool, path: str):
    """({"image_column": its name, "label_column": its name or None}, the label's ClassLabel
    names or None), of the columns ``given`` (None: not given).

    The image column: the one given, else the one the metadata calls an ``Image``, else the
    one binary (or struct with a binary ``bytes``) column, else the one named ``image``. The
    label column: the one given, else the one named ``label``; integers either way."""
    import pyarrow as pa

    image, label = given.get("image_column"), given.get("label_column")

    def holds_images(t) -> bool:  # binary, or a struct whose "bytes" field is
        if pa.types.is_struct(t) and t.get_field_index("bytes") >= 0:
            t = t.field(t.get_field_index("bytes")).type
        return pa.types.is_binary(t) or pa.types.is_large_binary(t)

    columns = ", ".join(f"{f.name} ({f.type})" for f in schema)[:300]
    # the ``huggingface`` metadata's features ({} when there is none); JSON that holds no
    # object (null, a list) has none either, and the columns are found by their types
    text = (schema.metadata or {}).get(b"huggingface", b"{}")
    meta = json_or_none(text)
    if meta is None and text.strip() != b"null":
        raise SourceError(f"{path}: its 'huggingface' schema metadata is not JSON")
    info = meta.get("info") if isinstance(meta, dict) else None
    features = info.get("features") if isinstance(info, dict) else None
    features = features if isinstance(features, dict) else {}
    found = [f.name for f in schema if holds_images(f.type)]
    if not found or (image is not None and image not in found):  # none, or not the one named
        given = f" {image!r} (--image-column: {_IMAGES})" if image is not None else f" ({_IMAGES})"
        raise SourceError(f"{path}: no image column{given}; its columns: {columns}")
    tagged = [n for n in found if (features.get(n) or {}).get("_type") == "Image"]
    choices = ([image] if image else [], tagged, found, [n for n in found if n == "image"])
    image = next((choice[0] for choice in choices if len(choice) == 1), None)
    if image is None:
        many = f"{len(found)} image columns ({', '.join(found)})"
        raise SourceError(f"{path}: {many}: name one with --image-column")
    if not labelled:
        return {"image_column": image, "label_column": None}, None
    name = label or "label"
    held = schema.field(name).type if name in schema.names else None  # there, of which type
    if held is None or not pa.types.is_integer(held):
        ints = [f.name for f in schema if pa.types.is_integer(f.type)]
        choose = f" (integer columns here: {', '.join(ints)})" if ints else ""
        given = " (--label-column)" if label else ""
        what = "is not there" if held is None else f"holds {held}, not integer class numbers"
        fix = f"name the label column with --label-column{choose}, or {Source.hint}"
        raise SourceError(f"{path}: label column {name!r}{given} {what}; {fix}")
    chosen = {"image_column": image, "label_column": name}
    feature = features.get(name)
    if not isinstance(feature, dict) or feature.get("_type") != "ClassLabel":
        return chosen, None
    names = feature.get("names")
    if not is_str_list(names) or len(set(names)) != len(names):  # each name one class number
        raise SourceError(f"{path}: the ClassLabel of {name!r} has no list of distinct names")
    return chosen, names
