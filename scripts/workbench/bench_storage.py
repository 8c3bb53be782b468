"""Storage rules for the fidelity benchmark: what a reader gets back from each way of storing.

``store(folder, files, setting, work)`` returns a ``Stored``: the records as a reader
hands them out (RGB uint8 (h, w, 3) at each record's own size), their geometry (source
size, source box, content box, as the pack records them), and the stored pixel bytes
per image. Two kinds of source:

  pack       the real packer (``pack_folder``: ``resize`` center-crop, stretch, pad or
             fit, ``codec`` raw or yuv420) and the real ``PackedImageDataset``: ``ds[i]``
             is each record (a yuv420 one converted to RGB as the format defines it);
  emulated   FFCV's storage rule: aspect kept, longer side ``side``, sizes truncated,
             full decode (no draft), one Pillow resize with the setting's filter
             ("area" = Pillow's BOX, area averaging, standing for FFCV's own INTER_AREA).

Stored bytes are the pixel bytes of the records alone: a pack's pixels section / N (raw
w*h*3, yuv420 w*h + 2 * ceil(w/2) * ceil(h/2) per record), FFCV's w*h*3 (its metadata,
alignment and page padding not counted); the mean over images. ``file_bytes`` (packs
only) is the .bin size / N.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from PIL import Image, ImageOps

from imgpack.format.index import read_index
from imgpack.packer.pack import pack_folder
from imgpack.packer.settings import FILTERS
from imgpack.reader.augment import geometry as record_geometry
from imgpack.reader.dataset import PackedImageDataset

__all__ = ["Setting", "Stored", "store"]


class Setting(NamedTuple):
    """One row: resize mode ("ffcv" = FFCV's rule), side (or (w, h)), filter, codec."""

    mode: str
    side: Any
    filter: str
    codec: str = "raw"


@dataclass
class Stored:
    """Records as a reader returns them, with the per-record geometry (the v2 attributes)."""

    records: list[np.ndarray]
    source_sizes: np.ndarray  # (N, 2) int64 (w, h)
    source_boxes: np.ndarray  # (N, 4) float32
    content_boxes: np.ndarray  # (N, 4) float32
    bytes: float  # mean stored pixel bytes per record
    file_bytes: float | None  # .bin size / N (real packs only)
    source: str  # "pack" or "emulated"
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.25, 0.25, 0.25)
    pack: Any = None  # the PackedImageDataset of a real pack
    index: np.ndarray | None = None  # the pack's record of each file

    def __len__(self) -> int:
        return len(self.records)


def _geometry_arrays(geos: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.asarray([g[0] for g in geos], dtype=np.int64),
        np.asarray([g[1] for g in geos], dtype=np.float32),
        np.asarray([g[2] for g in geos], dtype=np.float32),
    )


def _ffcv(folder: Path, files: list[str], s: Setting) -> Stored:
    recs, geos = [], []
    how = Image.BOX if s.filter == "area" else FILTERS[s.filter]
    for f in files:
        img = ImageOps.exif_transpose(Image.open(folder / f)).convert("RGB")
        w, h = img.size
        k = min(1.0, s.side / max(w, h))
        rw, rh = max(1, int(w * k)), max(1, int(h * k))  # FFCV's astype(int)
        recs.append(np.asarray(img.resize((rw, rh), how)))
        geos.append(((w, h), (0, 0, w, h), (0, 0, rw, rh)))
    nbytes = float(np.mean([r.size for r in recs]))
    return Stored(recs, *_geometry_arrays(geos), nbytes, None, "emulated")


def _packed(folder: Path, files: list[str], s: Setting, work: Path) -> Stored:
    rw, rh = (s.side, s.side) if isinstance(s.side, int) else tuple(s.side)
    out = work / f"{s.mode}-{rw}x{rh}-{s.filter}-{s.codec}.bin"
    pack_folder(folder, out, size=(rw, rh), resize=s.mode, filter=s.filter, codec=s.codec,
                force=True, progress=False, workers=1)  # fmt: skip
    ds = PackedImageDataset(out)
    order = {ds.source_path(i): i for i in range(len(ds))}
    idx = np.array([order[f] for f in files], dtype=np.int64)
    recs = [ds[int(i)][0].permute(1, 2, 0).numpy() for i in idx]  # RGB, as a reader gets it
    g = record_geometry(ds, idx, (rh, rw))  # the pack's own geometry
    nbytes = read_index(out).record_offsets[-1] / len(ds)  # the pixels section's bytes / N
    return Stored(
        recs, g.source_sizes.numpy().astype(np.int64), g.source_boxes.numpy(),
        g.content_boxes.numpy(), float(nbytes), out.stat().st_size / len(ds), "pack",
        tuple(ds.mean), tuple(ds.std), ds, idx,
    )  # fmt: skip


def store(folder: Path, files: list[str], s: Setting, work: Path) -> Stored:
    """The records of ``files`` stored under setting ``s``, in the order of ``files``."""
    if s.mode == "ffcv":
        return _ffcv(folder, files, s)
    return _packed(folder, files, s, work)
