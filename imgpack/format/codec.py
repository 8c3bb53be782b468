"""The ``yuv420`` codec: RGB to stored bytes and back, exactly as docs/format.md says.

Full-range BT.601 as JPEG (JFIF) uses: Y at full resolution, then Cb and Cr each
subsampled 2x2 (a chroma sample is the mean of the 1, 2 or 4 pixels of its block
that exist, so odd sizes need no padding). A record is the Y plane (h rows of w
bytes), then Cb, then Cr (ceil(h/2) rows of ceil(w/2) bytes each).

The forward conversion runs in the packer only (float64, as the spec writes it).
The back-conversion is what every reader must reproduce bit for bit, on any device:
it is defined exactly, in integers scaled by 10**6 (``R*10**6 = Y*10**6 +
1402000*(Cr-128)``, ...), which is the formula's real value rounded half up. Y*10**6 is
a whole multiple of the scale, so each channel is Y plus a whole number that depends
only on the pixel's chroma sample: ``YUV420_OFFSETS``, tabulated once for all 65,536
(Cb, Cr). Converting is then one lookup per chroma sample, one add per pixel, a clip and
a cast, the same steps in numpy here (the packer, a CPU reader) and in torch on a batch
(``imgpack.reader.yuv``, which looks up a copy of the same table). Numpy only.
"""

from __future__ import annotations

import numpy as np

from imgpack.errors import InvalidArgumentError

__all__ = ["YUV420_OFFSETS", "rgb_to_yuv420", "yuv420_to_rgb", "yuv420_planes"]

_COEFFICIENTS = ((0, 1_402_000), (-344_136, -714_136), (1_772_000, 0))
"""10**6 x the (Cb - 128, Cr - 128) coefficients of R, G and B (docs/format.md)."""


def _table() -> np.ndarray:
    cb, cr = np.meshgrid(np.arange(256) - 128, np.arange(256) - 128, indexing="ij")
    rows = [(b * cb + r * cr + 500_000) // 10**6 for b, r in _COEFFICIENTS]  # floor: half up
    table = np.stack(rows).astype(np.int16)
    table.flags.writeable = False
    return table


YUV420_OFFSETS = _table()
"""int16 (3, 256, 256): ``[k, Cb, Cr]`` is what channel k (R, G, B) adds to the Y of each
pixel of a chroma sample (Cb, Cr) before the clip to 0..255 (-227 to 225)."""


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


def yuv420_to_rgb(
    buf: np.ndarray, width: int, height: int, out: np.ndarray | None = None
) -> np.ndarray:
    """The (h, w, 3) uint8 RGB a reader gets back from one stored yuv420 record.

    Each chroma sample covers its 2x2 block (nearest); per pixel, exactly:
    R = Y + 1.402 (Cr-128), G = Y - 0.344136 (Cb-128) - 0.714136 (Cr-128),
    B = Y + 1.772 (Cb-128), each rounded half up and clipped to 0..255.

    ``out``: a uint8 (h, w, 3) array to write into (returned), of any strides: a slot of
    a larger HWC canvas, or the (1, 2, 0) transpose of a planar (3, h, w) one, which is
    where it is fastest (each channel is written as rows of contiguous bytes).
    """
    stored = np.asarray(buf, dtype=np.uint8).reshape(-1)
    y, cb, cr = yuv420_planes(stored, width, height)
    if out is None:
        out = np.empty((height, width, 3), dtype=np.uint8)
    elif (
        not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.shape != (height, width, 3)
    ):
        found = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
        raise InvalidArgumentError(
            f"out should be a uint8 ({height}, {width}, 3) array, found {found}"
        )
    elif not out.flags.writeable:
        raise InvalidArgumentError("out should be writable, found a read-only array")
    ch, cw = cb.shape
    # each chroma sample's offsets (its row of the table, Cb * 256 + Cr), then written
    # twice, once per pixel column of its block: an int16 read as 16 bits, times 0x10001,
    # fills both 16-bit halves of a uint32, read back as two int16. Every add below then
    # runs along whole rows (broadcasting a sample over its 2x2 block instead makes
    # numpy's inner loop two pixels long: about 10x slower)
    sample = (cb.astype(np.intp) << 8) | cr
    offsets = np.take(YUV420_OFFSETS.reshape(3, -1), sample, axis=1)  # (3, ch, cw)
    pairs = offsets.view(np.uint16).astype(np.uint32) * 0x10001
    twice = pairs.view(np.int16)[:, :, None, :width]  # (3, ch, 1, w): both rows of a block
    luma = np.empty((2 * ch, width), dtype=np.int16)  # an odd height's last row repeated
    luma[:height] = y
    luma[height:] = y[-1:]
    rgb = np.empty((3, 2 * ch, width), dtype=np.int16)
    np.add(luma.reshape(ch, 2, width), twice, out=rgb.reshape(3, ch, 2, width))
    np.clip(rgb, 0, 255, out=rgb)
    for k in range(3):
        np.copyto(out[..., k], rgb[k, :height], casting="unsafe")
    return out
