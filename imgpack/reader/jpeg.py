"""CPU decoding of JPEG records: the one place the reader calls a JPEG decoder.

simplejpeg (libjpeg-turbo inside) over Pillow: on 224x224 q90 records it decoded 5,200
images/s on one core against Pillow's 2,600 here, it takes any buffer (a record is a view
of the mapped pack, never copied into ``bytes``), it can write straight into a caller's
array, and it releases the GIL for the whole decode, so threads scale.

libjpeg-turbo decodes at 1/2, 1/4 or 1/8 of the stored size in the DCT domain
(``SCALES``): a record of ``w x h`` decoded at denominator d is ``scaled_size(w, h, d)``
and its pixel x' shows record pixels [x' d, (x' + 1) d). ``pick_scale`` chooses the
largest d of ``PICK_SCALES`` that still leaves a crop box ``GAP`` times the output
size. For tiny records
(both sides of at most 5 pixels) libjpeg may pick another of its num/8 factors with the
same output size; ``exact_scale`` says which d are safe to map boxes with.

Why ``GAP = 3`` and only 1/2 (``PICK_SCALES``): the issue's contract is PSNR against the
original resampled by Pillow's BILINEAR, and that triangle filter's spectrum (sinc^2) decays
slowly: its side lobes pass record frequencies far above the Nyquist frequency of a decode
at 1/d, which a scaled decode no longer holds (the truth's own aliasing). It is not the
decode: a DCT-scaled record scores the same as an exact d x d box average of the ORIGINAL
(within 0.1-0.3 dB), the box mapping has no offset (moving it 0.1 decoded px costs 4 dB),
and the loss is in luma, not chroma. It shows where the full decode is near exact: at
1/4 and 1/8 (a larger downscale leaves the full decode at 56-60 dB) and on grey textures
(no chroma to lose). Measured, loss in dB of the scaled path against the full decode's
Pillow resample, worst single crop (mean), eval + RandomResizedCrop crops, q90, imgpack's
float resample for the scaled path; "camera": 12 photos as ``make_sample_folder(large=
True)`` makes them (2000-3200 px, upscaled with grain); "512": the 13 installed photos at
512 px (nothing scales at 224 or 112 once the gap is over 2.29):

    records  out   d=2 gap 2       gap 3        gap 4   d=4 gap 3     gap 4     d=8 gap 3
    camera   224   -0.07 (-0.98)   -0.73        -0.94   (none)        (none)    (none)
    camera   112   -0.85 (-1.09)   -0.85        -0.75   +2.11 (-0.34) +0.52     (none)
    camera    64       -           -            -0.98   +1.56 (-0.40) +0.53     +4.22 (+1.05)
    512      112   +12.58 (+6.13)  (none)       (none)
    512       64   +7.84 (+1.39)   +3.84 (+0.63)  -      -             -         -
    512       32   +5.59 (-0.02)   +3.29 (-0.52) +2.58   +6.80 (+3.57) -         -

The 512 px failures at gap >= 3 are mostly the grey photographs (below). 1/4 still
misses by 1.65 dB at gap 6 (camera, out 32) and 1/8 by 2.84 at gap 6, so the reader
decodes at 1/2 at most, and only where the crop is 3x the output there: a 2000 px record's
crop to 224 of at least 1344 px, to 112 of 672 px.
Against a LANCZOS or BOX truth the scaled decode is far closer (-0.18 to -0.85 dB at 1/2
and 1/4, gaps 2 and 3, 8 photos at 512 px, crops to 32); a resample sharpened for the
box (a [-a, 1+2a, -a] kernel) wins back only 0.5-1.5 dB against BILINEAR.

Grey records keep the same rule: nothing known before decoding tells them apart. Per crop
the rule decodes at 1/2 (q90; 8 train crops and the eval crop per photo), loss as above,
worst (crops over 0.5 dB), beside the same measure for the loader's float resample of the
FULL decode; "grey pack": the photos converted to L, stored as single-component records:

    records                  out  crops  1/2 loss     full decode
    512 colour (10 photos)    64     14  +1.10 (3)    -0.62 (0)
    512 colour                32     67  +0.29 (0)    -0.61 (0)
    512 grass, gravel, brick  64     12  +4.63 (12)   -0.14 (0)
    512 grass, gravel, brick  32     23  +3.62 (21)   +1.97 (8)
    512 grey pack             32     90  +3.62 (72)   +1.97 (17)
    camera (16, colour)      224     49  -0.34 (0)    -0.99 (0)
    camera                    32     80  +3.41 (31)   +3.39 (32)
    camera, grey pack         64     80  +4.11 (78)   +4.07 (78)

In an RGB pack a grey source is stored as YCbCr 4:2:0 with flat chroma, so its header and
quantisation tables are those of every record of its quality; compressed bytes per pixel
overlap (q90, 512 px: grey 0.168-0.516, colour 0.149-0.343); a grey pack's records are
single-component, but grey photos in an RGB pack lose as much and nothing cheap sees them.
Where the loss is large the errors are below one level, and the measure is at its floor:
the truth and Pillow's resample of the full decode are both rounded to uint8, and round
alike, so the loader's own full decode misses 0.5 dB there too (last column). Against an
unrounded truth (imgpack's float64 resample of the original) the 512 grey photos to 32
score 73.5 dB decoded whole, 63.4 dB at 1/2, Pillow's resample of the full decode 58.5 dB
and the uint8 truth itself 58.6 dB.

Every failure of a record is a ``FormatError`` naming it (``where``): bytes the decoder
refuses, a size in the JPEG header that is not the record's, or a channel count that is
not the pack's. The header is read first (3 us), so a damaged size never makes the
decoder allocate for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import simplejpeg

from imgpack.errors import FormatError, InvalidArgumentError

__all__ = [
    "SCALES",
    "GAP",
    "PICK_SCALES",
    "scaled_size",
    "pick_scale",
    "pick_scales",
    "exact_scale",
    "check_scales",
    "decode",
]

SCALES = (1, 2, 4, 8)  # DCT scale denominators, all of which libjpeg-turbo decodes at
GAP = 3.0  # a record is decoded at 1/d only if its crop is still GAP x the output there
PICK_SCALES = (1, 2)  # the scales the reader picks from (1/4, 1/8 miss 0.5 dB: see above)
_COLOURSPACES = {1: ("Gray",), 3: ("YCbCr", "RGB")}  # what a record of C channels may hold
_OUTPUT = {1: "gray", 3: "rgb"}


def scaled_size(width: int, height: int, scale: int) -> tuple[int, int]:
    """(w', h'): the size of a ``width`` x ``height`` record decoded at 1/``scale``."""
    return -(-width // scale), -(-height // scale)


def pick_scale(
    box_w: float,
    box_h: float,
    out_w: int,
    out_h: int,
    gap: float = GAP,
    scales: tuple[int, ...] = PICK_SCALES,
) -> int:
    """The largest d in ``scales`` with box_w / d >= gap * out_w and box_h / d >= gap *
    out_h (box in record pixels): the smallest decode that still holds every detail the
    resample to the output keeps (``gap=1``: merely as large as the output; see ``GAP``)."""
    return int(pick_scales(np.array([[0.0, 0.0, box_w, box_h]]), out_w, out_h, gap, scales)[0])


def pick_scales(
    boxes: np.ndarray,
    out_w: int,
    out_h: int,
    gap: float = GAP,
    scales: tuple[int, ...] = PICK_SCALES,
) -> np.ndarray:
    """``pick_scale`` for each row of float (B, 4) (left, top, right, bottom): int64 (B,)."""
    boxes = np.asarray(boxes, dtype=np.float64)
    bw, bh = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    out = np.ones(len(boxes), dtype=np.int64)
    for d in sorted(scales):
        out[(bw / d >= gap * out_w) & (bh / d >= gap * out_h)] = d
    return out


def _scaled(side: np.ndarray, num: int) -> np.ndarray:
    return -(-side * num // 8)  # libjpeg's TJSCALED for the factor num/8


def exact_scale(sizes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Each of ``scales`` (int (B,)) lowered until libjpeg decodes record (w, h) of ``sizes``
    (int (B, 2)) at exactly 1/d: it picks the largest of its factors num/8 whose output is
    no larger than the size asked for, which for sides of at most 5 pixels can be a larger
    factor than 1/d with the same output size (3 pixels at 5/8 and at 1/2 both give 2)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    d = np.array(scales, dtype=np.int64)
    for _ in SCALES:
        w, h = sizes[:, 0], sizes[:, 1]
        bigger = 8 // np.maximum(d, 1) + 1  # the next factor up is (8/d + 1)/8
        same = (_scaled(w, bigger) <= -(-w // d)) & (_scaled(h, bigger) <= -(-h // d))
        lower = same & (d > 1)
        if not lower.any():
            break
        d[lower] //= 2
    return d


def check_scales(scales: Any, n: int) -> np.ndarray:
    """``scales`` as int64 (n,), each one of ``SCALES``, or InvalidArgumentError."""
    d = np.asarray(scales)
    if d.shape != (n,) or (n and d.dtype.kind not in "iu") or not np.isin(d, SCALES).all():
        raise InvalidArgumentError(
            f"scales should be {n} ints, each one of {SCALES}, found {d.dtype} {d.shape}"
        )
    return d.astype(np.int64)


def _refused(where: str, why: str) -> FormatError:
    return FormatError(f"{where}: damaged JPEG record ({why})")


def decode(
    buf: Any,
    width: int,
    height: int,
    channels: int,
    *,
    scale: int = 1,
    where: str = "JPEG record",
    out: np.ndarray | None = None,
) -> np.ndarray:
    """uint8 (h', w', C) pixels of the JPEG stream ``buf`` (bytes or a uint8 array) that
    must be a ``width`` x ``height`` image of ``channels`` (1 or 3), decoded at 1/``scale``
    (h', w' from ``scaled_size``). ``out``: a C-contiguous uint8 array of exactly that
    shape to decode into (returned). ``FormatError("<where>: damaged JPEG record (...)")``
    for anything the decoder refuses or a header that is not this record's."""
    if scale not in SCALES:
        raise InvalidArgumentError(f"scale should be one of {SCALES}, found {scale!r}")
    if channels not in _OUTPUT:
        raise InvalidArgumentError(f"channels should be 1 or 3, found {channels!r}")
    data = np.frombuffer(buf, dtype=np.uint8) if isinstance(buf, (bytes, bytearray)) else buf
    if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8:
        raise _refused(where, f"{len(data)} bytes that do not start with a JPEG SOI marker")
    try:
        h, w, space, _ = simplejpeg.decode_jpeg_header(data)
    except (ValueError, KeyError, IndexError) as e:
        raise _refused(where, f"header: {e}") from None
    if (w, h) != (width, height):
        raise _refused(where, f"its header says {w}x{h}, the index {width}x{height}")
    if space not in _COLOURSPACES[channels]:
        raise _refused(where, f"{space} colour space in a pack of {channels} channel(s)")
    sw, sh = scaled_size(width, height, scale)
    kw = {} if scale == 1 else {"min_width": sw, "min_height": sh}
    if out is not None:
        if out.shape != (sh, sw, channels) or out.dtype != np.uint8 or not out.flags.c_contiguous:
            raise InvalidArgumentError(
                f"out should be a C-contiguous uint8 array {(sh, sw, channels)}, found "
                f"{out.dtype} {out.shape}"
            )
        kw["buffer"] = out
    try:
        img = simplejpeg.decode_jpeg(data, colorspace=_OUTPUT[channels], **kw)
    except (ValueError, KeyError, IndexError) as e:
        raise _refused(where, str(e)) from None
    if img.shape != (sh, sw, channels):  # cannot happen with a checked header; never trusted
        raise _refused(where, f"decoded to {img.shape}, expected {(sh, sw, channels)}")
    return out if out is not None else img
