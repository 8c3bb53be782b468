"""What the JPEG benchmark encodes and decodes with, besides imgpack's own reader.

Records of the fidelity rows are encoded as the packer encodes them (Pillow, baseline, not
optimised, the given quality and chroma subsampling). simplejpeg is the plain decoder the
reader is compared with; Pillow's decoder (also libjpeg-turbo) is timed beside it because
it is what the reader would have used otherwise. ``LoopPool`` runs the plain loops and the
FFCV emulation on threads the same way imgpack's ``decodepool`` runs the reader's (one
shared counter, the caller's thread among them), but as code of its own, so that the
comparison never times imgpack's code on both sides.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import simplejpeg
from PIL import Image

__all__ = ["SUBSAMPLING", "LoopPool", "encode", "plain_decode", "pillow_decode", "to_decoded"]

SUBSAMPLING = {"4:4:4": 0, "4:2:0": 2}  # Pillow's codes


class LoopPool:
    """``run(n, work, threads)``: ``work(i)`` for i in range(n), the caller's thread and
    threads - 1 helpers taking the next i from one shared counter."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._size = 0

    def run(self, n: int, work: Callable[[int], None], threads: int) -> None:
        counter = itertools.count()

        def share() -> None:
            for i in counter:  # next() on a count is atomic under the GIL
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


def encode(img: Image.Image, quality: int, subsampling: str = "4:2:0") -> bytes:
    """Baseline JFIF bytes of ``img`` at ``quality``, as the packer writes a record."""
    out = io.BytesIO()
    img.save(out, "JPEG", quality=quality, subsampling=SUBSAMPLING[subsampling],
             optimize=False, progressive=False)  # fmt: skip
    return out.getvalue()


def plain_decode(buf: Any) -> np.ndarray:
    """The plain loop's call: simplejpeg at full size, RGB (h, w, 3) uint8."""
    return simplejpeg.decode_jpeg(buf)


def pillow_decode(buf: bytes) -> np.ndarray:
    """Pillow's decode of the same bytes, RGB (h, w, 3) uint8."""
    return np.asarray(Image.open(io.BytesIO(buf)).convert("RGB"))


def to_decoded(boxes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Record-pixel boxes (B, 4) in an image decoded at 1/scale: pixel x' of a DCT-scaled
    decode shows record pixels [x' scale, (x' + 1) scale), so coordinates divide."""
    return np.asarray(boxes, dtype=np.float64) / np.asarray(scale, dtype=np.float64)[:, None]
