"""Version 3's rules for records: the codec, the ``record_size`` field, where records lie.

Version 3 stores no offsets: ``imgpack.format.layout.record_offsets`` derives them from
the record sizes, and validation is that every size lies within the pack's bound and
the computed end is the pixels section's size (which the header states too). The
offsets themselves are computed only when a reader asks (``PackIndex.record_offsets``). Like
``imgpack.format.checks``, each function judges values already read. Numpy only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from imgpack.errors import InconsistentPackError, MissingFieldError
from imgpack.format.fields import RECORD_SIZE
from imgpack.format.layout import CODECS, RecordField, record_nbytes

__all__ = ["check_codec", "check_record_size_field", "check_record_sizes"]

_MAX_PIXELS_NBYTES = 2**63  # what int64 offsets (and any file system) can place
_CHUNK = 1 << 14  # records per step of check_record_sizes


def check_codec(raw: dict[str, Any], version: int, channels: int, name: str) -> str:
    """Version 3's codec: a known one, and yuv420 only for 3 channels; before, always raw."""
    if version < 3:
        return "raw"
    codec = raw["codec"]
    if codec not in CODECS:
        raise InconsistentPackError(
            f"{name}: codec is {codec!r}, expected one of {', '.join(CODECS)}"
            f" (packed by a newer imgpack? upgrade imgpack)"
        )
    if codec == "yuv420" and channels != 3:
        raise InconsistentPackError(
            f"{name}: codec yuv420 stores 3 channels, shape says {channels}"
        )
    return codec


def check_record_size_field(fields: dict[str, RecordField], version: int, name: str) -> None:
    """``record_size`` is in every version 3 pack, marked required, and in no older one."""
    f = fields.get(RECORD_SIZE)
    if version >= 3 and f is None:
        raise MissingFieldError(f"{name}: missing record field {RECORD_SIZE!r} (version 3)")
    if version >= 3 and not f.required:
        raise InconsistentPackError(
            f"{name}: record field {RECORD_SIZE!r} is marked optional; it is required"
        )
    if version < 3 and f is not None:
        raise InconsistentPackError(
            f"{name}: record field {RECORD_SIZE!r} is version 3's, this pack is version {version}"
        )


def check_record_sizes(
    sizes: np.ndarray, shape: tuple[int, int, int], codec: str, pixels_nbytes: int, name: str
) -> tuple[int, bool]:
    """Every record within the bound, and the records end where the pixels section does.

    ``sizes`` is the (N, 2) ``record_size`` field, (width, height), as read. Returns the
    pixels (per channel) the records hold, and whether every record is the bound's size
    and raw (``PackIndex.uniform``). Walks the sizes in chunks: memory stays flat in N.
    """
    h, w, c = shape
    n = len(sizes)
    if record_nbytes(codec, w, h, c) * n >= _MAX_PIXELS_NBYTES:
        raise InconsistentPackError(
            f"{name}: {n} records of up to {h}x{w}x{c} could need 2**63 bytes or more"
        )
    end = pixels = 0
    uniform = codec == "raw"
    for a in range(0, n, _CHUNK):
        part = sizes[a : a + _CHUNK].astype(np.int64)
        rw, rh = part[:, 0], part[:, 1]
        bad = (rw < 1) | (rw > w) | (rh < 1) | (rh > h)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InconsistentPackError(
                f"{name}: record {a + i} is {rw[i]}x{rh[i]} (record_size, width x height), "
                f"outside the bound 1..{w} x 1..{h}"
            )
        end += int(record_nbytes(codec, rw, rh, c).sum())
        pixels += int((rw * rh).sum())
        uniform = uniform and bool(((rw == w) & (rh == h)).all())
    if end != pixels_nbytes:
        raise InconsistentPackError(
            f"{name}: the {n} records ({codec}, sizes from record_size) end at {end} bytes, "
            f"the pixels section has {pixels_nbytes}"
        )
    return pixels, uniform
