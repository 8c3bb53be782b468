"""Record fields: which ones are standard, and the per-record geometry three of them hold.

A record field is a section with one fixed-shape element per record (``fields`` in
the index). The rules an entry must pass (unknown ones refused when marked required,
read as absent otherwise) are ``imgpack.format.index``'s, with the others an index must
pass; the fallbacks a reader gives for absent geometry are ``PackIndex.geometry``'s.
"""

from __future__ import annotations

from typing import NamedTuple

from imgpack.format.layout import CODECS

__all__ = [
    "RECORD_FIELDS",
    "GEOMETRY_FIELDS",
    "RECORD_SIZE",
    "RECORD_LENGTH",
    "RecordGeometry",
    "whole_record",
]


class FieldSpec(NamedTuple):
    """A standard record field: its dtype and per-record shape (None: any positive length)."""

    dtype: str
    shape: tuple[int | None, ...]
    codecs: tuple[str, ...] = ()  # where set: packs of these codecs hold it, marked required,
    # and packs of any other codec do not


# the record fields this imgpack understands; any other one is read only if optional
RECORD_FIELDS = {
    "record_size": FieldSpec("<u4", (2,), CODECS),  # (width, height) of the record
    "record_length": FieldSpec("<u4", (1,), ("jpeg",)),  # each record's stored bytes
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
    Plain numbers, as the packer makes and writes them; the reader takes a batch of them
    as arrays (``imgpack.reader.transform``).
    """

    source_size: tuple[int, int]
    source_box: tuple[float, float, float, float]
    content_box: tuple[float, float, float, float]


def whole_record(width: int, height: int) -> RecordGeometry:
    """The geometry of a record that is its whole source: what a pack without geometry
    fields means, and what a writer records when it is given no other."""
    box = (0.0, 0.0, float(width), float(height))
    return RecordGeometry((width, height), box, box)
