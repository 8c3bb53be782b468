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
a cast: here in numpy and OpenCV (the packer, a CPU reader), in torch on a batch
(``imgpack.reader.device``, which looks up a copy of the same table). OpenCV, a dependency of
the reader's CPU crops too, is imported on the first back-conversion, so importing the
format (or the packer's command line) loads only numpy.
"""

from __future__ import annotations

import numpy as np

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


def _steps() -> np.ndarray:
    offsets = YUV420_OFFSETS.reshape(3, -1).T  # (65536, 3)
    steps = np.zeros((2, 65536, 2, 4), np.uint8)  # up/down, sample, its 2 columns, RGBA
    steps[..., :3] = np.clip([offsets, -offsets], 0, 255)[:, :, None]
    return steps.reshape(2, -1, 8).view(np.uint64)[..., 0]


_STEPS = _steps()
"""uint64 (2, 65536): row 0 holds ``max(offset, 0)``, row 1 ``max(-offset, 0)`` of each
(Cb * 256 + Cr), as the bytes of two RGBA pixels (A = 0): a chroma sample's two columns.
With them the clip is two saturating uint8 steps, ``clip(Y + o, 0, 255) = (Y +sat up)
-sat down``: exact, as only one of them is not 0."""


def rgb_to_yuv420(rgb: np.ndarray) -> np.ndarray:
    """The stored bytes of one (h, w, 3) uint8 RGB record: a 1-D uint8 array.

    ``w*h + 2 * ceil(w/2) * ceil(h/2)`` bytes: Y, then Cb, then Cr, each row-major.
    """
    h, w, _ = rgb.shape  # the writer checked it: (h, w, 3) uint8, h and w at least 1
    r, g, b = (rgb[..., k].astype(np.float64) for k in range(3))
    y = 0.299 * r + 0.587 * g + 0.114 * b
    cb = 128 - 0.168736 * r - 0.331264 * g + 0.5 * b
    cr = 128 + 0.5 * r - 0.418688 * g - 0.081312 * b
    ch, cw = (h + 1) // 2, (w + 1) // 2
    # pixels that exist in each 2x2 block: 2 per full row/column pair, 1 at an odd edge
    rows = np.minimum(2, h - 2 * np.arange(ch))[:, None]
    cols = np.minimum(2, w - 2 * np.arange(cw))[None, :]
    planes = [y.reshape(-1)]
    for c in (cb, cr):
        padded = np.zeros((2 * ch, 2 * cw))
        padded[:h, :w] = c
        sums = padded.reshape(ch, 2, cw, 2).sum(axis=(1, 3))
        planes.append((sums / (rows * cols)).reshape(-1))
    # every plane rounded half up and clipped to a byte, as the spec writes it
    return np.clip(np.floor(np.concatenate(planes) + 0.5), 0, 255).astype(np.uint8)


def yuv420_planes(buf: np.ndarray, width: int, height: int):
    """The (Y (h, w), Cb (ch, cw), Cr (ch, cw)) uint8 views of one stored record (of
    ``layout.record_nbytes`` bytes: a validated index placed it)."""
    buf = np.asarray(buf, dtype=np.uint8).reshape(-1)
    ch, cw = (height + 1) // 2, (width + 1) // 2
    n = width * height  # the Y plane, then the two chroma planes one after the other
    return buf[:n].reshape(height, width), *buf[n:].reshape(2, ch, cw)


def yuv420_to_rgb(
    buf: np.ndarray, width: int, height: int, out: np.ndarray | None = None
) -> np.ndarray:
    """The (h, w, 3) uint8 RGB a reader gets back from one stored yuv420 record.

    Each chroma sample covers its 2x2 block (nearest); per pixel, exactly:
    R = Y + 1.402 (Cr-128), G = Y - 0.344136 (Cb-128) - 0.714136 (Cr-128),
    B = Y + 1.772 (Cb-128), each rounded half up and clipped to 0..255.

    ``out``: a writable uint8 (h, w, 3) array to write into (returned; the reader makes
    it), of any strides: fastest a slot of a larger HWC canvas (rows of RGB pixels,
    written straight), else (a planar (3, h, w) canvas's (1, 2, 0) transpose, ...)
    converted beside it, then copied in.
    """
    stored = np.ascontiguousarray(buf, dtype=np.uint8).reshape(-1)  # OpenCV reads rows
    y, cb, cr = yuv420_planes(stored, width, height)
    if out is None:
        out = np.empty((height, width, 3), dtype=np.uint8)
    import cv2  # a dependency (the CPU crops'); loaded on the first use, not by the packer's CLI

    ch, cw = cb.shape
    # each chroma sample's (Cb * 256 + Cr), then its steps over both columns of its block:
    # one 8-byte lookup per sample (``np.take`` of wide items is several times faster than
    # of bytes), up in rows [0, ch) and down in [ch, 2 ch); then whole rows of RGB through
    # OpenCV's vectorised saturating add and subtract, each block's two rows as the even
    # and the odd rows of the image
    sample = cv2.merge([cr, cb]).view("<u2")[..., 0].astype(np.intp)
    steps = np.take(_STEPS, sample, axis=1).view(np.uint8).reshape(2 * ch, 2 * cw, 4)
    steps = cv2.cvtColor(steps, cv2.COLOR_RGBA2RGB)[:, :width]
    # OpenCV writes rows of RGB pixels, then splits them into channel planes (a planar
    # canvas's transpose); anything else (a view of the record itself, ...) gets a copy
    straight = out.strides[1:] == (3, 1) and out.strides[0] >= 3 * width
    straight = straight and not np.may_share_memory(out, stored)
    rgb = out if straight else np.empty((height, width, 3), np.uint8)
    cv2.cvtColor(y, cv2.COLOR_GRAY2RGB, dst=rgb)
    for rows in (rgb[0::2], rgb[1::2])[: min(height, 2)]:
        cv2.add(rows, steps[: len(rows)], dst=rows)
        cv2.subtract(rows, steps[ch : ch + len(rows)], dst=rows)
    if rgb is not out and out.strides[1] == 1 and out.strides[0] >= width:
        cv2.split(rgb, [out[..., k] for k in range(3)])
    elif rgb is not out:
        np.copyto(out, rgb)
    return out
