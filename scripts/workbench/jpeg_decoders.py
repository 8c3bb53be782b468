"""What the JPEG benchmark encodes and decodes with, and where imgpack's own decoder plugs in.

``imgpack.reader.jpeg`` (issue 20) is the reader's one home of CPU JPEG decoding:
``decode``, ``pick_scale``, ``scaled_size`` and ``SCALES``. ``reader_jpeg()`` returns it
when the installed reader has it; until then it returns ``STANDIN``, four functions
written here from the contract (simplejpeg, the same DCT scales). Its decoding threads
(``imgpack.reader.decodepool.POOL.run(n, work, threads)``) plug in the same way through
``reader_pool()``, with ``StandinPool`` until then. Every result the benchmark writes
says which of the two it used, so that no table passes a stand-in off as imgpack's.

Records are encoded as the packer encodes them: Pillow, baseline, not optimised, the
given quality and chroma subsampling. simplejpeg is the plain decoder the reader is
compared with; Pillow's decoder (also libjpeg-turbo) is timed beside it because it is
what the reader would have used otherwise.
"""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import numpy as np
import simplejpeg
from PIL import Image

__all__ = ["SUBSAMPLING", "STANDIN", "StandinPool", "reader_jpeg", "reader_pool", "encode",
           "plain_decode", "pillow_decode", "to_decoded"]  # fmt: skip

SUBSAMPLING = {"4:4:4": 0, "4:2:0": 2}  # Pillow's codes


def _scaled_size(w: int, h: int, d: int) -> tuple[int, int]:
    return math.ceil(w / d), math.ceil(h / d)


def _pick_scale(box_w: float, box_h: float, out_w: int, out_h: int) -> int:
    for d in (8, 4, 2):
        if box_w / d >= out_w and box_h / d >= out_h:
            return d
    return 1


def _decode(buf: Any, width: int, height: int, channels: int, *, scale: int = 1,
            where: str = "record") -> np.ndarray:  # fmt: skip
    colour = "GRAY" if channels == 1 else "RGB"
    if scale == 1:
        return simplejpeg.decode_jpeg(buf, colour)
    w, h = _scaled_size(width, height, scale)
    return simplejpeg.decode_jpeg(buf, colour, min_width=w, min_height=h, min_factor=scale)


# A STAND-IN for imgpack.reader.jpeg, used only until the reader has its own.
STANDIN = SimpleNamespace(
    SCALES=(1, 2, 4, 8), scaled_size=_scaled_size, pick_scale=_pick_scale, decode=_decode,
    __name__="workbench.jpeg_decoders.STANDIN",
)  # fmt: skip


def reader_jpeg() -> Any:
    """imgpack's JPEG decoding module, or ``STANDIN`` when this reader has none yet."""
    try:
        from imgpack.reader import jpeg
    except ImportError:
        return STANDIN
    return jpeg


class StandinPool:
    """``run(n, work, threads)``: ``work(i)`` for i in range(n), the caller's thread and
    threads - 1 helpers taking the next i from one shared counter. The STAND-IN for
    imgpack's decoding pool, and the pool the FFCV emulation runs on."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._size = 0

    def run(self, n: int, work: Callable[[int], None], threads: int) -> None:
        counter = itertools.count()

        def share() -> None:
            for i in counter:
                if i >= n:
                    return
                work(i)

        helpers = min(threads, n) - 1
        if helpers > self._size:
            self.close()
            self._executor, self._size = ThreadPoolExecutor(helpers), helpers
        futures = [self._executor.submit(share) for _ in range(helpers)] if helpers > 0 else []
        share()
        for f in futures:
            f.result()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown()
        self._executor, self._size = None, 0


def reader_pool() -> tuple[Any, bool]:
    """imgpack's decoding pool and True, or a ``StandinPool`` and False."""
    try:
        from imgpack.reader.decodepool import POOL
    except ImportError:
        return StandinPool(), False
    return POOL, True


def encode(img: Image.Image, quality: int, subsampling: str = "4:2:0") -> bytes:
    """Baseline JFIF bytes of ``img`` at ``quality``, as the packer writes a record."""
    out = io.BytesIO()
    img.save(out, "JPEG", quality=quality, subsampling=SUBSAMPLING[subsampling],
             optimize=False, progressive=False)  # fmt: skip
    return out.getvalue()


def plain_decode(buf: bytes) -> np.ndarray:
    """The plain loop's call: simplejpeg at full size, RGB (h, w, 3) uint8."""
    return simplejpeg.decode_jpeg(buf)


def pillow_decode(buf: bytes) -> np.ndarray:
    """Pillow's decode of the same bytes, RGB (h, w, 3) uint8."""
    return np.asarray(Image.open(io.BytesIO(buf)).convert("RGB"))


def to_decoded(boxes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Record-pixel boxes (B, 4) in an image decoded at 1/scale: pixel x' of a DCT-scaled
    decode shows record pixels [x' scale, (x' + 1) scale), so coordinates divide."""
    return np.asarray(boxes, dtype=np.float64) / np.asarray(scale, dtype=np.float64)[:, None]
