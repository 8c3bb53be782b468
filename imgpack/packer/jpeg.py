"""JPEG records in the packer: Pillow encodes them; they are decoded back, as the reader
decodes them, for their stats.

A jpeg record is one complete baseline JPEG stream of the record's own size: 3 components
(YCbCr, chroma at 4:2:0) for an RGB pack, 1 for a grayscale one. The packer encodes with
Pillow (libjpeg-turbo inside), never optimised or progressive, so any baseline decoder
reads every record. The stats and digest of a record are of its decoded pixels: what a
reader gets back, not what was encoded.

A source that needs no change is its own jpeg record (``source_record``, asked by
``decode.decode_record`` once it has read the source's headers): decoding and
encoding again would add a second generation of loss and cost an encode. It is stored byte
for byte when its record would be the whole source at its own size and its stream already
is what a jpeg record must be (``docs/format.md``, the jpeg codec): a JPEG (not MPO) ending
at its EOI, baseline, 8-bit, with the pack's channel count (YCbCr for 3), no EXIF or XMP
rotation, no resize, crop or padding (and so no draft), and decoded by libjpeg-turbo
without a warning. Any doubt: ``None``, and the ordinary path decodes and encodes it.
"""

from __future__ import annotations

import io
from contextlib import suppress

import numpy as np
from PIL import Image

# the reader's decode of a record (simplejpeg, strictly: a libjpeg warning is an error), so a
# record's sums are of the pixels a reader gets back, and a stream the reader would refuse is
# refused by the writer and ``verify`` too; a FormatError (a ValueError) says what is wrong
from imgpack.reader.jpeg import decode as decode_jpeg

__all__ = ["as_image", "decode_jpeg", "encode_image", "is_record_stream", "source_record"]

SUBSAMPLING = {3: "4:2:0", 1: "4:0:0"}  # what the index says, by channel count
# frame headers: SOF0..SOF15 but DHT (C4), JPG (C8) and DAC (CC); SOF0 is baseline
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RST0..7: no length


def as_image(pixels: Image.Image | np.ndarray) -> Image.Image:
    """An (h, w, C) uint8 array (C = 1 or 3) as a Pillow image (L or RGB); an image as it is."""
    if isinstance(pixels, Image.Image):
        return pixels
    return Image.fromarray(pixels[..., 0] if pixels.shape[2] == 1 else pixels)


def encode_image(img: Image.Image | np.ndarray, quality: int) -> bytes:
    """One record's bytes: ``img`` (mode RGB or L, or an (h, w, C) uint8 array, C = 1 or 3,
    as ``PackWriter.append`` checked it) as a baseline JFIF stream at ``quality``."""
    buf = io.BytesIO()  # subsampling 2: 4:2:0 (a grayscale image has no chroma to subsample)
    # Pillow's defaults for the rest: not optimised, not progressive (a baseline stream)
    as_image(img).save(buf, "JPEG", quality=quality, subsampling=2)
    return buf.getvalue()


def max_jpeg_bytes(width: int, height: int, channels: int) -> int:
    """The most bytes the packer's own encoding of a record this size can take.

    libjpeg-turbo's worst-case bound (``tjBufSize``): the size padded to whole MCUs (8 px
    gray, 16 px at 4:2:0), 2 bytes a pixel for gray and 3 for 4:2:0 colour, plus 2048. A
    source stored as it came may be larger (metadata); buffers sized by this pass such a
    record another way.
    """
    mcu, per = (8, 2) if channels == 1 else (16, 3)
    pad = lambda n: -(-n // mcu) * mcu  # noqa: E731
    return pad(width) * pad(height) * per + 2048


def is_record_stream(data: bytes, size: tuple[int, int], channels: int) -> bool:
    """Whether ``data`` is, by its markers alone (no decoding), what a jpeg record's stream
    must be: baseline (SOF0), 8 bits, ``size``, ``channels`` components (for 3, YCbCr: no
    Adobe APP14 segment that says RGB), its markers well formed up to the first scan, and
    the first EOI after that scan its last two bytes.

    Entropy-coded data never holds ``FF D9`` (an ``FF`` there is followed by ``00`` or a
    restart marker), so the first EOI after the first SOS ends the image: bytes after it
    (a second image, as in MPO files, or a camera's trailer) are not one record's stream.
    """
    if data[:2] != b"\xff\xd8":
        return False
    i, adobe_rgb, frame = 2, False, None
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return False
        marker = data[i + 1]
        if marker == 0xFF or marker in _STANDALONE:  # a fill byte, or a marker with no length
            i += 1 if marker == 0xFF else 2
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        segment = data[i + 4 : i + 2 + length]
        if marker in (0xD8, 0xD9) or length < 2 or len(segment) != length - 2:
            return False  # a second SOI, an EOI before any scan, a cut segment
        if marker == 0xDA:
            ends = data.find(b"\xff\xd9", i + 2 + length) == len(data) - 2
            return frame == (0xC0, 8, *size, channels) and not adobe_rgb and ends  # SOF0, 8-bit
        if marker == 0xEE and segment[:5] == b"Adobe" and len(segment) >= 12:
            adobe_rgb = segment[11] == 0  # transform 0: no YCbCr conversion
        if marker in _SOF and frame is None:  # (SOFn, precision, width, height, components)
            if len(segment) < 6:
                return False
            w, h = int.from_bytes(segment[3:5], "big"), int.from_bytes(segment[1:3], "big")
            frame = (marker, segment[0], w, h, segment[5])
        i += 2 + length
    return False


def source_record(stream: bytes, size: tuple[int, int], channels: int) -> np.ndarray | None:
    """The pixels a reader decodes of a source's whole ``stream`` (a JPEG whose record would
    be the whole source at its own ``size``, unrotated) where it may be stored as it came
    (the module docstring); None when it must be decoded and encoded.

    Pillow ignores libjpeg's warnings ("Corrupt JPEG data: extraneous bytes before marker",
    a premature end), which the reader does not: a source stored as it came must decode
    without one, or it is re-encoded from the pixels Pillow makes of it.
    """
    if len(stream) < 2**32 and is_record_stream(stream, size, channels):
        with suppress(ValueError):  # a stream the reader refuses: decoded and encoded
            return decode_jpeg(stream, *size, channels)
    return None
