"""Record fields: the standard ones, their index entries, their arrays.

A record field is a section with one fixed-shape element per record (``fields`` in
the index). This module knows which fields are standard (and the per-record
geometry three of them hold), the rule for unknown ones (refused when marked
required, ignored otherwise), and the fallbacks a reader gives for absent ones.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from imgpack.errors import FormatError
from imgpack.format.layout import RecordField
from imgpack.validate import is_count, is_int_list, type_name

__all__ = [
    "FIELD_DTYPES",
    "FIELD_NAME",
    "MAX_FIELD_DIMS",
    "FieldSpec",
    "RECORD_FIELDS",
    "GEOMETRY_FIELDS",
    "RECORD_SIZE",
    "RECORD_LENGTH",
    "RecordGeometry",
    "whole_record",
    "parse_fields",
    "field_array",
    "geometry_arrays",
]

FIELD_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}", re.ASCII)
MAX_FIELD_DIMS = 4

# dtypes a record field may have: explicit byte order, fixed width
FIELD_DTYPES = ("|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8")


@dataclass(frozen=True)
class FieldSpec:
    """A standard record field: its dtype and per-record shape (None: any positive length)."""

    dtype: str
    shape: tuple[int | None, ...]


# the record fields this imgpack understands; any other one is read only if optional
RECORD_FIELDS = {
    "record_size": FieldSpec("<u4", (2,)),  # required: (width, height) of the record
    "record_length": FieldSpec("<u4", (1,)),  # jpeg packs, required: each record's stored bytes
    "source_size": FieldSpec("<u4", (2,)),  # (width, height) of the source after EXIF rotation
    "source_box": FieldSpec("<f4", (4,)),  # (l, t, r, b) in source pixels that the record shows
    "content_box": FieldSpec("<f4", (4,)),  # (l, t, r, b) in record pixels where that lies
    "targets": FieldSpec("<f4", (None,)),  # a fixed-length target vector per record
}
GEOMETRY_FIELDS = ("source_size", "source_box", "content_box")
RECORD_SIZE = "record_size"  # in every pack, marked required
RECORD_LENGTH = "record_length"  # in every jpeg pack, marked required; in no other


class RecordGeometry(NamedTuple):
    """Where one record came from: source size (w, h) after EXIF rotation, and two boxes.

    Record pixel x_r shows source x_s = sbox.l + (x_r - cbox.l) * sbox.w / cbox.w (same in y).
    Plain numbers, as the packer makes and writes them; a batch of them as tensors is
    the reader's ``imgpack.reader.augment.Geometry``.
    """

    source_size: tuple[int, int]
    source_box: tuple[float, float, float, float]
    content_box: tuple[float, float, float, float]


def whole_record(width: int, height: int) -> RecordGeometry:
    """The geometry of a record that is its whole source: what a pack without geometry
    fields means, and what a writer records when it is given no other."""
    box = (0.0, 0.0, float(width), float(height))
    return RecordGeometry((width, height), box, box)


def parse_fields(entries: dict[str, Any], count: int, name: str) -> dict[str, RecordField]:
    """Every entry of ``fields``, checked; unknown required ones refused (FormatError)."""
    fields = {}
    for key, entry in entries.items():
        what = f"{name}: record field {key!r}"
        if not FIELD_NAME.fullmatch(key):
            raise FormatError(
                f"{what}: a name is 1-64 lowercase letters, digits or '_', starting with a letter"
            )
        if not isinstance(entry, dict):
            raise FormatError(f"{what} should be an object, found {type_name(entry)}")
        required = entry.get("required")
        if not isinstance(required, bool):
            raise FormatError(f"{what} needs 'required' true or false, found {required!r}")
        spec = RECORD_FIELDS.get(key)
        if spec is None and required:
            raise FormatError(
                f"{what} is required to read this pack, and this imgpack does not know it;"
                f" upgrade imgpack"
            )
        off, nbytes, dtype, shape = (entry.get(k) for k in ("offset", "nbytes", "dtype", "shape"))
        for v, label in ((off, "offset"), (nbytes, "nbytes")):
            if not is_count(v):
                raise FormatError(f"{what} has bad {label} {v!r}")
        if dtype not in FIELD_DTYPES:
            raise FormatError(
                f"{what} has dtype {dtype!r}, expected one of {', '.join(FIELD_DTYPES)}"
            )
        if not is_int_list(shape, minimum=1) or len(shape) > MAX_FIELD_DIMS:
            raise FormatError(
                f"{what} has shape {shape!r}, expected a list of at most "
                f"{MAX_FIELD_DIMS} positive ints"
            )
        if spec is not None:
            fixed = [d if d is not None else "K" for d in spec.shape]
            if (
                dtype != spec.dtype
                or len(shape) != len(spec.shape)
                or any(d is not None and d != s for d, s in zip(spec.shape, shape))
            ):
                raise FormatError(f"{what} is {dtype} {shape}, expected {spec.dtype} {fixed}")
        need = count * math.prod(shape) * np.dtype(dtype).itemsize
        if nbytes != need:
            raise FormatError(
                f"{what} has {nbytes} bytes, {count} records of {dtype} {shape} need {need}"
            )
        fields[key] = RecordField(off, nbytes, dtype, tuple(shape), required)
    return fields


def field_array(raw: bytes, f: RecordField, count: int) -> np.ndarray:
    """The (count, *shape) array of field ``f`` from its bytes."""
    return np.frombuffer(raw, dtype=f.dtype, count=count * math.prod(f.shape)).reshape(
        count, *f.shape
    )


def geometry_arrays(
    sizes: np.ndarray | None,
    sboxes: np.ndarray | None,
    cboxes: np.ndarray | None,
    record_sizes: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source_sizes int64 (N, 2), source_boxes f32 (N, 4), content_boxes f32 (N, 4)).

    The geometry fields are optional: one the pack lacks means "each record is its
    whole source", so the source size is the record's own (``record_sizes``, (N, 2) of
    (width, height)) and both boxes are the whole record.
    """
    own = np.asarray(record_sizes, dtype=np.int64).reshape(-1, 2)
    whole = np.concatenate([np.zeros_like(own), own], axis=1).astype(np.float32)
    out_sizes = own.copy() if sizes is None else sizes.astype(np.int64)
    out_s = whole.copy() if sboxes is None else sboxes.astype(np.float32)
    out_c = whole.copy() if cboxes is None else cboxes.astype(np.float32)
    for a in (out_sizes, out_s, out_c):
        a.flags.writeable = False
    return out_sizes, out_s, out_c
