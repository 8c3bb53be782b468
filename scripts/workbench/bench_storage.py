"""Storage rules for the fidelity benchmark: what a reader gets back from each way of storing.

``store(folder, files, setting, work)`` returns a ``Stored``: the records as a reader
hands them out (RGB uint8 (h, w, 3) at each record's own size), their geometry (source
size, source box, content box, as format v2/v3 record it), and the stored pixel bytes
per image. Three kinds of source:

  pack       the real packer (``pack_folder``) and the real ``PackedImageDataset``;
  sim        format v3's ``--resize fit`` / ``--codec yuv420`` simulated: the packer's
             own ``decode_record`` (its filter, JPEG draft, EXIF handling) resizing to
             the fit size (``fit_size``), then, for yuv420, the contract's exact
             conversion in numpy (``yuv420_encode`` / ``yuv420_decode``);
  emulated   FFCV's storage rule: aspect kept, longer side ``side``, sizes truncated,
             full decode (no draft), one Pillow resize with the setting's filter
             ("area" = Pillow's BOX, area averaging, standing for FFCV's own INTER_AREA).

Stored bytes are the pixel bytes of the records alone: raw w*h*3, yuv420 w*h + 2 *
ceil(w/2) * ceil(h/2), FFCV w*h*3 (its metadata, alignment and page padding not
counted); the mean over images. ``file_bytes`` (packs only) is the .bin size / N.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from PIL import Image, ImageOps

from imgpack.format.index import read_index
from imgpack.packer.decode import decode_record
from imgpack.packer.pack import pack_folder
from imgpack.packer.settings import FILTERS, DecodeSettings
from imgpack.reader.augment import geometry as record_geometry
from imgpack.reader.dataset import PackedImageDataset

__all__ = [
    "Setting",
    "Stored",
    "store",
    "real_v3",
    "fit_size",
    "yuv420_nbytes",
    "yuv420_encode",
    "yuv420_decode",
]


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
    source: str  # "pack", "sim" or "emulated"
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.25, 0.25, 0.25)
    pack: Any = None  # the PackedImageDataset of a real pack
    index: np.ndarray | None = None  # the pack's record of each file

    def __len__(self) -> int:
        return len(self.records)


# ---- the contract's yuv420 (full-range BT.601, JFIF), in float64 numpy -------------------


def yuv420_nbytes(width: int, height: int) -> int:
    """Y at full size, Cb and Cr at ceil(w/2) x ceil(h/2)."""
    return width * height + 2 * ((width + 1) // 2) * ((height + 1) // 2)


def _store(x: np.ndarray) -> np.ndarray:
    return np.clip(np.floor(x + 0.5), 0, 255).astype(np.uint8)


def _block_mean(plane: np.ndarray) -> np.ndarray:
    """Mean of each 2x2 block; at an odd right/bottom edge, of the 1 or 2 pixels that exist."""
    h, w = plane.shape
    h2, w2 = (h + 1) // 2, (w + 1) // 2
    total = np.zeros((2 * h2, 2 * w2))
    count = np.zeros((2 * h2, 2 * w2))
    total[:h, :w], count[:h, :w] = plane, 1.0
    total = total.reshape(h2, 2, w2, 2).sum((1, 3))
    return total / count.reshape(h2, 2, w2, 2).sum((1, 3))


def yuv420_encode(rgb: np.ndarray) -> np.ndarray:
    """(h, w, 3) uint8 RGB -> the record's bytes: the Y plane, then Cb, then Cr."""
    x = rgb.astype(np.float64)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    y = 0.299 * r + 0.587 * g + 0.114 * b
    cb = 128 - 0.168736 * r - 0.331264 * g + 0.5 * b
    cr = 128 + 0.5 * r - 0.418688 * g - 0.081312 * b
    planes = (y, _block_mean(cb), _block_mean(cr))
    return np.concatenate([_store(p).ravel() for p in planes])


def yuv420_decode(buf: np.ndarray, width: int, height: int) -> np.ndarray:
    """The record's bytes -> (h, w, 3) uint8 RGB: chroma replicated 2x2 (nearest), then
    R = Y + 1.402 (Cr-128), G = Y - 0.344136 (Cb-128) - 0.714136 (Cr-128), B = Y + 1.772
    (Cb-128), rounded half up exactly (in integers scaled by 10**6, as docs/format.md
    fixes it: float64 may round a tie such as 1.772 * 125 = 221.5 either way)."""
    w2, h2 = (width + 1) // 2, (height + 1) // 2
    n = width * height
    y = buf[:n].reshape(height, width).astype(np.int64) * 1_000_000 + 500_000
    cb, cr = (
        buf[n + k * w2 * h2 : n + (k + 1) * w2 * h2].reshape(h2, w2).astype(np.int64) - 128
        for k in range(2)
    )
    cb, cr = (p.repeat(2, 0).repeat(2, 1)[:height, :width] for p in (cb, cr))
    rgb = np.stack([y + 1_402_000 * cr, y - 344_136 * cb - 714_136 * cr, y + 1_772_000 * cb], -1)
    return np.clip(rgb // 1_000_000, 0, 255).astype(np.uint8)


# ---- storage rules --------------------------------------------------------------------------


def fit_size(width: int, height: int, side: int) -> tuple[int, int]:
    """``--resize fit``: the longer side becomes ``side`` (never upscaled), aspect kept, the
    shorter rounded to nearest (at least 1); (width, height), as the v3 packer's plan."""
    if max(width, height) <= side:
        return width, height
    if width >= height:
        return side, max(1, round(height * side / width))
    return max(1, round(width * side / height)), side


def _oriented_size(path: Path) -> tuple[int, int]:
    with Image.open(path) as img:
        w, h = img.size
        orientation = img.getexif().get(0x0112, 1)
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)


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


def _simulated_fit(folder: Path, files: list[str], s: Setting) -> Stored:
    recs, geos, nbytes = [], [], []
    for f in files:
        rw, rh = fit_size(*_oriented_size(folder / f), s.side)
        settings = DecodeSettings(width=rw, height=rh, resize="stretch", filter=s.filter)
        img, g = decode_record(folder / f, settings)
        rgb = np.asarray(img.convert("RGB"))
        if s.codec == "yuv420":
            rgb = yuv420_decode(yuv420_encode(rgb), rw, rh)
            nbytes.append(yuv420_nbytes(rw, rh))
        else:
            nbytes.append(rgb.size)
        recs.append(rgb)
        geos.append((g.source_size, g.source_box, g.content_box))
    return Stored(recs, *_geometry_arrays(geos), float(np.mean(nbytes)), None, "sim")


def real_v3() -> bool:
    """Whether this checkout's packer has format v3's ``--resize fit`` and ``--codec``."""
    from imgpack.packer.settings import RESIZE_MODES

    return "fit" in RESIZE_MODES and "codec" in inspect.signature(pack_folder).parameters


def _packed(folder: Path, files: list[str], s: Setting, work: Path) -> Stored:
    rw, rh = (s.side, s.side) if isinstance(s.side, int) else tuple(s.side)
    out = work / f"{s.mode}-{rw}x{rh}-{s.filter}-{s.codec}.bin"
    codec = {"codec": s.codec} if s.codec != "raw" else {}
    pack_folder(folder, out, size=(rw, rh), resize=s.mode, filter=s.filter, force=True,
                progress=False, workers=1, **codec)  # fmt: skip
    ds = PackedImageDataset(out)
    order = {ds.source_path(i): i for i in range(len(ds))}
    idx = np.array([order[f] for f in files], dtype=np.int64)
    recs = [ds[int(i)][0].permute(1, 2, 0).numpy() for i in idx]  # RGB, as a reader gets it
    g = record_geometry(ds, idx, (rh, rw))  # the pack's own geometry
    offsets = getattr(read_index(out), "record_offsets", None)  # format v3
    nbytes = float(np.mean([r.size for r in recs])) if offsets is None else offsets[-1] / len(ds)
    return Stored(
        recs, g.source_sizes.numpy().astype(np.int64), g.source_boxes.numpy(),
        g.content_boxes.numpy(), float(nbytes), out.stat().st_size / len(ds), "pack",
        tuple(ds.mean), tuple(ds.std), ds, idx,
    )  # fmt: skip


def store(folder: Path, files: list[str], s: Setting, work: Path) -> Stored:
    """The records of ``files`` stored under setting ``s``, in the order of ``files``."""
    if s.mode == "ffcv":
        return _ffcv(folder, files, s)
    if (s.mode == "fit" or s.codec != "raw") and not real_v3():
        return _simulated_fit(folder, files, s)
    return _packed(folder, files, s, work)
