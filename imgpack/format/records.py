"""The rules for records: the codec, the ``record_size`` field, where records lie.

A pack stores no record offsets: ``imgpack.format.layout.record_offsets`` derives them from
the record sizes (jpeg: from the ``record_length`` field), and validation is that every
size lies within the pack's bound and the computed end is the pixels section's size
(which the header states too). The
offsets themselves are computed only when a reader asks (``PackIndex.record_offsets``). Like
``imgpack.format.checks``, each function judges values already read. Numpy only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from imgpack.errors import FormatError
from imgpack.format.fields import RECORD_LENGTH, RECORD_SIZE
from imgpack.format.layout import CODECS, RecordField, record_nbytes
from imgpack.validate import is_count, type_name

__all__ = [
    "check_codec",
    "check_standard_fields",
    "check_jpeg",
    "check_record_sizes",
]

_MAX_PIXELS_NBYTES = 2**63  # what int64 offsets (and any file system) can place
_MAX_LENGTH = 2**32 - 1  # a record_length is <u4
_MIN_JPEG = 2  # a JPEG stream starts with SOI (FF D8): no record can be shorter
_CHUNK = 1 << 14  # records per step of check_record_sizes


def check_codec(raw: dict[str, Any], channels: int, name: str) -> str:
    """The codec: a known one, and yuv420 only for 3 channels."""
    codec = raw["codec"]
    if codec not in CODECS:
        raise FormatError(
            f"{name}: codec is {codec!r}, expected one of {', '.join(CODECS)}"
            f" (packed by a newer imgpack? upgrade imgpack)"
        )
    if codec == "yuv420" and channels != 3:
        raise FormatError(f"{name}: codec yuv420 stores 3 channels, shape says {channels}")
    return codec


def check_standard_fields(fields: dict[str, RecordField], codec: str, name: str) -> None:
    """``record_size`` is in every pack and ``record_length`` in every jpeg pack (a jpeg
    record's bytes do not follow from its size, every other codec's do), each marked
    required; ``record_length`` is in no other pack."""
    for key, needed in ((RECORD_SIZE, True), (RECORD_LENGTH, codec == "jpeg")):
        f = fields.get(key)
        if needed and f is None:
            jpeg = " (codec jpeg)" if key == RECORD_LENGTH else ""
            raise FormatError(f"{name}: missing record field {key!r}{jpeg}")
        if needed and not f.required:
            raise FormatError(f"{name}: record field {key!r} is marked optional; it is required")
        if not needed and f is not None:
            raise FormatError(
                f"{name}: record field {key!r} is the jpeg codec's, this pack is {codec}"
            )


def check_jpeg(raw: dict[str, Any], codec: str, count: int, name: str) -> int | None:
    """A jpeg pack's ``jpeg`` object: the quality it was encoded at (1..100), the chroma
    subsampling (a string) and how many records are a source's own bytes (0..count).
    Returns the quality; None for the other codecs (which ignore the key)."""
    if codec != "jpeg":
        return None
    obj = raw.get("jpeg")
    if obj is None:
        raise FormatError(f"{name}: missing the 'jpeg' object (quality, ...) of a jpeg pack")
    if not isinstance(obj, dict):
        raise FormatError(f"{name}: a jpeg pack needs a 'jpeg' object, found {type_name(obj)}")
    quality = obj.get("quality")
    if not is_count(quality) or not 1 <= quality <= 100:
        raise FormatError(f"{name}: jpeg.quality is {quality!r}, expected an int 1..100")
    if not isinstance(obj.get("subsampling"), str):
        raise FormatError(
            f"{name}: jpeg.subsampling is {obj.get('subsampling')!r}, expected a string"
        )
    as_is = obj.get("stored_as_is")
    if not is_count(as_is) or as_is > count:
        raise FormatError(f"{name}: jpeg.stored_as_is is {as_is!r}, expected an int 0..{count}")
    return quality


def check_record_sizes(
    sizes: np.ndarray,
    shape: tuple[int, int, int],
    codec: str,
    pixels_nbytes: int,
    name: str,
    lengths: np.ndarray | None = None,
) -> tuple[int, bool]:
    """Every record within the bound, and the records end where the pixels section does.

    ``sizes`` is the (N, 2) ``record_size`` field, (width, height), as read; ``lengths``
    the (N, 1) ``record_length`` field of a jpeg pack (each at least 2 bytes, SOI).
    Returns the pixels (per channel) the records hold, and whether every record is the
    bound's size and raw (``PackIndex.uniform``). Walks the sizes in chunks: memory stays
    flat in N.
    """
    h, w, c = shape
    n = len(sizes)
    most = _MAX_LENGTH if codec == "jpeg" else record_nbytes(codec, w, h, c)
    if most * n >= _MAX_PIXELS_NBYTES:
        raise FormatError(
            f"{name}: {n} records of up to {most} bytes each could need 2**63 bytes or more"
        )
    end = pixels = 0
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
        if codec == "jpeg":
            nbytes = lengths[a : a + _CHUNK].astype(np.int64).reshape(-1)
            short = nbytes < _MIN_JPEG
            if short.any():
                i = int(np.flatnonzero(short)[0])
                raise FormatError(
                    f"{name}: record {a + i} has record_length {nbytes[i]}, "
                    f"a JPEG stream has at least {_MIN_JPEG} bytes (SOI)"
                )
        else:
            nbytes = record_nbytes(codec, rw, rh, c)
        end += int(nbytes.sum())
        pixels += int((rw * rh).sum())
        uniform = uniform and bool(((rw == w) & (rh == h)).all())
    if end != pixels_nbytes:
        whence = "lengths from record_length" if codec == "jpeg" else "sizes from record_size"
        raise FormatError(
            f"{name}: the {n} records ({codec}, {whence}) end at {end} bytes, "
            f"the pixels section has {pixels_nbytes}"
        )
    return pixels, uniform
