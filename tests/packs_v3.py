"""Format version 3 packs for the reader's tests, written by the real writer from arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import photo_like

from imgpack.format.codec import rgb_to_yuv420, yuv420_to_rgb
from imgpack.packer.writer import PackWriter

# (width, height) within a 20 x 16 bound: full, narrow, odd both ways, one pixel, flat
SIZES = [(20, 16), (13, 16), (20, 7), (7, 5), (1, 1), (20, 16), (9, 11), (20, 3)]
BOUND = (16, 20)  # (H, W)


def rgb_back(record: np.ndarray, codec: str) -> np.ndarray:
    """What a reader gets back from ``record`` (h, w, 3) stored with ``codec``."""
    if codec == "raw":
        return record
    h, w, _ = record.shape
    return yuv420_to_rgb(rgb_to_yuv420(record), w, h)


def write_v3(
    out: Path,
    codec: str = "raw",
    sizes=SIZES,
    bound=BOUND,
    seed: int = 0,
    classes=("a", "b", "c"),
) -> tuple[Path, list[np.ndarray], np.ndarray]:
    """A v3 pack of photo-like records of ``sizes``: (bin, the RGB records as written, labels)."""
    h, w = bound
    records = [photo_like(rw, rh, seed=seed + k) for k, (rw, rh) in enumerate(sizes)]
    labels = np.arange(len(records)) % len(classes)
    with PackWriter(out, height=h, width=w, classes=list(classes), codec=codec) as wr:
        for k, rec in enumerate(records):
            wr.append(rec, int(labels[k]), f"{classes[labels[k]]}/{k}.png")
        wr.finish(packer={"size": [w, h], "resize": "fit", "filter": "bilinear"})
    return out, records, labels.astype(np.int64)
