"""CPU decoding of JPEG records: the one place the reader calls a JPEG decoder.

simplejpeg (libjpeg-turbo inside) rather than Pillow: it is the faster of the two on small
records, it takes any buffer (a record is a view of the mapped pack, never copied into
``bytes``), it can write straight into a caller's array, and it releases the GIL for the
whole decode, so threads scale (docs/benchmarks.md has the measurements).

libjpeg-turbo decodes at 1/2, 1/4 or 1/8 of the stored size in the DCT domain
(``SCALES``): a record of ``w x h`` decoded at denominator d is ``scaled_size(w, h, d)``
and its pixel x' shows record pixels [x' d, (x' + 1) d). ``pick_scales`` chooses the
largest d of ``PICK_SCALES`` that still leaves a crop box ``GAP`` times the output size.
libjpeg decodes at the largest of its num/8 factors whose output is no larger than the size
asked for, which for a side of at most 5 pixels can be another factor than 1/d with the same
output (3 pixels at 5/8 and at 1/2 both give 2); a box that is ``GAP`` times an output of at
least one pixel at 1/2 is at least 8 pixels a side, where 1/2 is the factor libjpeg takes,
so every scale picked is decoded at exactly 1/d.

Why a gap, and only 1/2 (``PICK_SCALES``). The contract: per crop, the scaled path's PSNR
against the original (resampled by Pillow's BILINEAR) within 0.5 dB of the full decode's
Pillow resample. That triangle filter's spectrum (sinc^2) decays slowly: its side lobes
pass record frequencies above the Nyquist frequency of a decode at 1/d, which the scaled
decode no longer holds. It is not the decode (a DCT-scaled record scores as an exact d x d
box average of the original does, the box mapping has no offset): so the crop must stay
well above the output at the decoded scale. ``GAP`` is the smallest gap at which
``scripts/bench_scaled.py`` found no colour crop missing the contract at any quality the
packer offers; 1/4 and 1/8 missed it even at larger gaps (docs/benchmarks.md, "The
scale-aware decode").

Grey photographs (grass, gravel, brick, or any photo converted to L) can still miss at that
gap, and keep the same rule: nothing known before decoding tells them apart (in an RGB
pack a grey source is YCbCr 4:2:0 with flat chroma, its header, quantisation tables and
bytes per pixel like any colour record's), and where they miss most, the loader's own full
decode misses too: the measure is at its floor.

Every failure of a record is a ``FormatError`` naming it (``where``): bytes the decoder
refuses, a size in the JPEG header that is not the record's, or a channel count that is
not the pack's. The header is read first, so a damaged size never makes the decoder
allocate for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import simplejpeg

from imgpack.errors import FormatError

__all__ = ["SCALES", "GAP", "PICK_SCALES", "scaled_size", "pick_scales", "decode"]

SCALES = (1, 2, 4, 8)  # DCT scale denominators, all of which libjpeg-turbo decodes at
GAP = 4.0  # a record is decoded at 1/d only if its crop is still GAP x the output there
PICK_SCALES = (1, 2)  # the scales the reader picks from (1/4, 1/8 miss 0.5 dB: see above)
_COLOURSPACES = {1: ("Gray",), 3: ("YCbCr", "RGB")}  # what a record of C channels may hold
_OUTPUT = {1: "gray", 3: "rgb"}


def scaled_size(width: Any, height: Any, scale: Any) -> tuple[Any, Any]:
    """(w', h'): the size of a ``width`` x ``height`` record decoded at 1/``scale`` (ints,
    or numpy int arrays of one record each): decoded pixel x' shows record pixels
    [x' scale, (x' + 1) scale)."""
    return -(-width // scale), -(-height // scale)


def pick_scales(boxes: np.ndarray, out_w: int, out_h: int) -> np.ndarray:
    """For each crop box, float (B, 4) (left, top, right, bottom) in record pixels, the
    largest d of ``PICK_SCALES`` with box_w / d >= GAP * out_w and box_h / d >= GAP * out_h:
    the smallest decode that still holds every detail the resample to the output keeps
    (see ``GAP``); 1 where none is. int64 (B,)."""
    bw, bh = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    out = np.ones(len(boxes), dtype=np.int64)
    for d in PICK_SCALES:
        out[(bw / d >= GAP * out_w) & (bh / d >= GAP * out_h)] = d
    return out


def _refused(where: str, why: str) -> FormatError:
    return FormatError(f"{where}: damaged JPEG record ({why})")


def decode(
    data: Any,
    width: int,
    height: int,
    channels: int,
    *,
    scale: int = 1,
    where: str = "JPEG record",
    out: np.ndarray | None = None,
) -> np.ndarray:
    """uint8 (h', w', C) pixels of the JPEG stream ``data`` (bytes or a uint8 array) that
    must be a ``width`` x ``height`` image of ``channels`` (1 or 3), decoded at 1/``scale``
    (h', w' from ``scaled_size``). ``out``: a C-contiguous uint8 array of exactly that
    shape to decode into (a view of it returned). ``FormatError("<where>: damaged JPEG
    record (...)")`` for anything the decoder refuses or a header that is not this record's."""
    if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8:
        raise _refused(where, f"{len(data)} bytes that do not start with a JPEG SOI marker")
    try:  # the header first: a damaged size never makes the decoder allocate for it
        h, w, space, _ = simplejpeg.decode_jpeg_header(data)
        if (w, h) == (width, height) and space in _COLOURSPACES[channels]:
            sw, sh = scaled_size(width, height, scale)
            # the smallest of libjpeg's scales at least sw x sh: 1/scale (``pick_scales``)
            return simplejpeg.decode_jpeg(  # into ``out`` where given (a view of it)
                data, colorspace=_OUTPUT[channels], min_width=sw, min_height=sh, buffer=out
            )
    except (ValueError, KeyError, IndexError) as e:  # a stream that does not decode
        raise _refused(where, str(e)) from None
    if (w, h) != (width, height):
        raise _refused(where, f"its header says {w}x{h}, the index {width}x{height}")
    raise _refused(where, f"{space} colour space in a pack of {channels} channel(s)")
