"""JPEG records in the packer: Pillow encodes them and decodes them back for their stats.

A jpeg record is one complete baseline JPEG stream of the record's own size: 3 components
(YCbCr, chroma at 4:2:0) for an RGB pack, 1 for a grayscale one. The packer encodes with
Pillow (libjpeg-turbo inside), never optimised or progressive, so any baseline decoder
reads every record. The stats and digest of a record are of its decoded pixels: what a
reader gets back, not what was encoded.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image

from imgpack.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_QUALITY",
    "SUBSAMPLING",
    "check_quality",
    "encode_image",
    "encode_jpeg",
    "decode_jpeg",
    "max_jpeg_bytes",
]

DEFAULT_QUALITY = 90  # FFCV's ImageNet recipes; 36 KB per 512 px image (issue 20)
SUBSAMPLING = {3: "4:2:0", 1: "4:0:0"}  # what the index says, by channel count
_PIL_420 = 2  # Pillow's subsampling=2: 4:2:0
_MODES = {1: "L", 3: "RGB"}


def check_quality(quality: Any) -> int:
    """A JPEG quality: a whole number 1..100."""
    if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
        raise InvalidArgumentError(f"jpeg quality must be a whole number 1..100, got {quality!r}")
    return quality


def encode_image(img: Image.Image, quality: int) -> bytes:
    """One record's bytes: ``img`` (mode RGB or L) as a baseline JFIF stream at ``quality``."""
    buf = io.BytesIO()
    img.save(
        buf, "JPEG", quality=quality, subsampling=_PIL_420, optimize=False, progressive=False
    )
    return buf.getvalue()


def encode_jpeg(pixels: np.ndarray, quality: int) -> bytes:
    """``encode_image`` of an (h, w, C) uint8 array, C = 1 or 3."""
    arr = np.ascontiguousarray(pixels)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] not in _MODES or 0 in arr.shape:
        raise InvalidArgumentError(
            f"a jpeg record is an (h, w, 1 or 3) uint8 image, got {arr.shape} {arr.dtype}"
        )
    img = Image.fromarray(arr[..., 0] if arr.shape[2] == 1 else arr)
    return encode_image(img, quality)


def decode_jpeg(buf: Any, width: int, height: int, channels: int) -> np.ndarray:
    """The (h, w, C) uint8 pixels of one stored record, decoded by Pillow.

    Raises ValueError saying what is wrong: not a JPEG, not decodable to the end, another
    size or component count than the record's. Callers name the record.
    """
    data = bytes(memoryview(buf).cast("B"))
    try:
        with Image.open(io.BytesIO(data), formats=["JPEG"]) as img:
            img.load()
            mode, size = img.mode, img.size
            if mode == _MODES.get(channels) and size == (width, height):
                arr = np.asarray(img)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise ValueError(f"not a decodable JPEG ({e})") from None
    if mode != _MODES.get(channels) or size != (width, height):
        raise ValueError(
            f"a {size[0]}x{size[1]} {mode} JPEG, the record is {width}x{height} "
            f"with {channels} channel{'s' if channels > 1 else ''}"
        )
    return arr.reshape(height, width, channels)


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
