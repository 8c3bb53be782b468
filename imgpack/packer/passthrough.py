"""Sources stored as they came: a JPEG that needs no change is its own jpeg record.

Decoding and encoding again would add a second generation of loss and cost an encode.
A source is stored byte for byte when its record would be the whole source at its own
size and its stream already is what a jpeg record must be (``docs/format.md``, the jpeg
codec): a JPEG (not MPO) ending at its EOI, baseline, 8-bit, with the pack's channel
count (YCbCr for 3), no EXIF or XMP rotation, no resize, crop or padding (and so no
draft), and decoded by libjpeg-turbo without a warning. Its digest is of Pillow's
decode, which is the record the ordinary path would have encoded. Any doubt: ``None``,
and the ordinary path decodes and encodes it.
"""

from __future__ import annotations

import io
import os

from PIL import Image

from imgpack.format.fields import RecordGeometry, whole_record
from imgpack.packer.decode import exif_orientation, plan_resize
from imgpack.packer.digest import RecordDigest, digest_stored
from imgpack.packer.jpeg import decodes_strictly, frame_of
from imgpack.packer.settings import DecodeSettings

__all__ = ["keeps_whole_source", "stored_as_is"]

_MODES = {1: "L", 3: "RGB"}
_JPEG_START = b"\xff\xd8\xff"


def keeps_whole_source(width: int, height: int, s: DecodeSettings) -> bool:
    """Whether the record of a ``width`` x ``height`` source (no rotation) is the whole
    source at its own size: no resize, crop or padding."""
    region, out = plan_resize(width, height, (s.width, s.height), s.resize, s.crop_ratio)
    whole = tuple(float(v) for v in region) == (0.0, 0.0, float(width), float(height))
    padded = s.resize == "pad" and out != (s.width, s.height)
    return whole and out == (width, height) and not padded


def stored_as_is(
    path: str | os.PathLike | bytes, s: DecodeSettings
) -> tuple[bytes, RecordDigest, RecordGeometry, tuple[int, int]] | None:
    """(the file's bytes, digest, geometry, (width, height)) when the source (a file, or
    its bytes) may be stored as it came in a jpeg pack of settings ``s``; None when it must
    be decoded and encoded (or is no image: the ordinary path then says why).

    Pillow reads the headers first (size, mode, rotation: no pixels), so a JPEG that is
    resized anyway costs no more than that; only a candidate is read whole and checked.
    """
    try:
        with io.BytesIO(path) if isinstance(path, bytes) else open(path, "rb") as f:
            if f.read(3) != _JPEG_START:
                return None
            f.seek(0)
            with Image.open(f, formats=["JPEG"]) as img:  # headers only
                size = img.size
                if (
                    img.format != "JPEG"
                    or img.mode != _MODES[s.channels]
                    or not 0 < size[0] * size[1] <= s.max_pixels
                    or not keeps_whole_source(*size, s)
                    or exif_orientation(img) != 1
                ):
                    return None
            f.seek(0)
            data = f.read()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return None
    frame = frame_of(data)
    if (
        frame is None
        or not (frame.baseline and frame.precision == 8 and frame.ends_at_eoi)
        or frame.components != s.channels
        or frame.adobe_rgb
        or (frame.width, frame.height) != size
        or len(data) >= 2**32
        or not decodes_strictly(data, s.channels)
    ):
        return None
    try:
        digest = digest_stored(data, "jpeg", *size, s.channels)
    except ValueError:
        return None
    return data, digest, whole_record(*size), size
