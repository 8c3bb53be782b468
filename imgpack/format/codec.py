"""The ``yuv420`` codec: RGB to stored bytes and back, exactly as docs/format.md says.

Full-range BT.601 as JPEG (JFIF) uses: Y at full resolution, then Cb and Cr each
subsampled 2x2 (a chroma sample is the mean of the 1, 2 or 4 pixels of its block
that exist, so odd sizes need no padding). A record is the Y plane (h rows of w
bytes), then Cb, then Cr (ceil(h/2) rows of ceil(w/2) bytes each).

The forward conversion runs in the packer only (float64, as the spec writes it).
The back-conversion is what every reader must reproduce bit for bit, on any device:
it is computed exactly, in integers scaled by 10**6 (``R*10**6 = Y*10**6 +
1402000*(Cr-128)``, ...), which is the formula's real value rounded half up.
Numpy only.
"""

from __future__ import annotations

import numpy as np

from imgpack.errors import InvalidArgumentError

__all__ = ["rgb_to_yuv420", "yuv420_to_rgb", "yuv420_planes"]

_ONE = 1_000_000  # the back-conversion's fixed point: the constants have 6 decimals
_HALF = _ONE // 2


def _round(x: np.ndarray) -> np.ndarray:
    return np.clip(np.floor(x + 0.5), 0, 255).astype(np.uint8)


def rgb_to_yuv420(rgb: np.ndarray) -> np.ndarray:
    """The stored bytes of one (h, w, 3) uint8 RGB record: a 1-D uint8 array.

    ``w*h + 2 * ceil(w/2) * ceil(h/2)`` bytes: Y, then Cb, then Cr, each row-major.
    """
    rgb = np.asarray(rgb)
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3 or 0 in rgb.shape:
        raise InvalidArgumentError(
            f"rgb_to_yuv420 takes an (h, w, 3) uint8 image, got {rgb.shape} {rgb.dtype}"
        )
    h, w, _ = rgb.shape
    r, g, b = (rgb[..., k].astype(np.float64) for k in range(3))
    y = 0.299 * r + 0.587 * g + 0.114 * b
    cb = 128 - 0.168736 * r - 0.331264 * g + 0.5 * b
    cr = 128 + 0.5 * r - 0.418688 * g - 0.081312 * b
    ch, cw = (h + 1) // 2, (w + 1) // 2
    # pixels that exist in each 2x2 block: 2 per full row/column pair, 1 at an odd edge
    rows = np.minimum(2, h - 2 * np.arange(ch))[:, None]
    cols = np.minimum(2, w - 2 * np.arange(cw))[None, :]
    planes = [_round(y).reshape(-1)]
    for c in (cb, cr):
        padded = np.zeros((2 * ch, 2 * cw))
        padded[:h, :w] = c
        sums = padded.reshape(ch, 2, cw, 2).sum(axis=(1, 3))
        planes.append(_round(sums / (rows * cols)).reshape(-1))
    return np.concatenate(planes)


def yuv420_planes(buf: np.ndarray, width: int, height: int):
    """The (Y (h, w), Cb (ch, cw), Cr (ch, cw)) uint8 views of one stored record."""
    buf = np.asarray(buf, dtype=np.uint8).reshape(-1)
    ch, cw = (height + 1) // 2, (width + 1) // 2
    need = width * height + 2 * ch * cw
    if width < 1 or height < 1 or buf.size != need:
        raise InvalidArgumentError(
            f"a {width}x{height} yuv420 record has {need} bytes, got {buf.size}"
        )
    n = width * height
    y = buf[:n].reshape(height, width)
    cb = buf[n : n + ch * cw].reshape(ch, cw)
    cr = buf[n + ch * cw :].reshape(ch, cw)
    return y, cb, cr


def yuv420_to_rgb(buf: np.ndarray, width: int, height: int) -> np.ndarray:
    """The (h, w, 3) uint8 RGB a reader gets back from one stored yuv420 record.

    Each chroma sample covers its 2x2 block (nearest); per pixel, exactly:
    R = Y + 1.402 (Cr-128), G = Y - 0.344136 (Cb-128) - 0.714136 (Cr-128),
    B = Y + 1.772 (Cb-128), each rounded half up and clipped to 0..255.
    """
    y, cb, cr = yuv420_planes(buf, width, height)
    y = y.astype(np.int64) * _ONE
    db = (cb.astype(np.int64) - 128).repeat(2, 0).repeat(2, 1)[:height, :width]
    dr = (cr.astype(np.int64) - 128).repeat(2, 0).repeat(2, 1)[:height, :width]
    out = np.empty((height, width, 3), dtype=np.uint8)
    for k, scaled in enumerate(
        (y + 1_402_000 * dr, y - 344_136 * db - 714_136 * dr, y + 1_772_000 * db)
    ):
        out[..., k] = np.clip((scaled + _HALF) // _ONE, 0, 255)
    return out
