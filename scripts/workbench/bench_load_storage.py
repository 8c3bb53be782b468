"""The loader's images/s per storage rule (issue 18): raw stretch against fit raw and fit yuv420.

Every pack is made from the same JPEG folder (the load benchmark's sample), with the
same filter, so the three hold the same photographs and count and differ only in how
they store them. Each row is the median images/s of ``repeats`` full warm epochs of
``make_loader(ds, batch_size, transform=T, seed=0[, device=...])`` after one untimed
epoch, with T one of:

  canvas  ``T(images, records) -> images``: the delivery alone (records gathered into the
          batch canvas, zero beyond each record; a yuv420 canvas converted to RGB);
  train   ``DeviceTransform.train(ds, size)``: what training runs; on a CPU the resample
          dominates.

A record of varying size needs a transform (``make_loader`` refuses it without one),
so every row has one, the stretch pack's too. With no CUDA device the delivery converts
yuv420 to RGB on the CPU; with one, on the device after the copy.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from imgpack.diagnose.measure import close_loader, stat
from workbench.bench import time_epoch

__all__ = ["STORAGE", "canvas", "storage_rows"]

STORAGE = (("stretch", 224, "raw"), ("fit", 256, "raw"), ("fit", 362, "yuv420"))


def canvas(images: torch.Tensor, records: Any) -> torch.Tensor:
    """The identity transform: what the loader delivers, as it delivers it."""
    return images


def _pack(src: Path, work: Path, mode: str, side: int, codec: str, filt: str) -> Path:
    from imgpack.packer.pack import pack_folder

    out = work / f"{src.name}-{mode}-{side}-{codec}-{filt}.bin"
    if not out.with_suffix(".json").exists():
        pack_folder(src, out, size=(side, side), resize=mode, codec=codec, filter=filt,
                    force=True, progress=False)  # fmt: skip
    return out


def storage_rows(
    src: str | os.PathLike,
    work_dir: str | os.PathLike,
    *,
    batch_size: int,
    repeats: int,
    size: int = 224,
    storage: Sequence[tuple[str, int, str]] = STORAGE,
    filter: str = "lanczos",
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """One row per storage rule and transform (module docstring)."""
    from imgpack.format.index import read_index
    from imgpack.reader.dataset import PackedImageDataset
    from imgpack.reader.loader import make_loader
    from imgpack.reader.transform import DeviceTransform

    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else None
    rows = []
    for mode, side, codec in storage:
        pack = _pack(Path(src), work, mode, side, codec, filter)
        pixels = int(read_index(pack).record_offsets[-1])  # the records' stored bytes
        for name in ("canvas", "train"):
            ds = PackedImageDataset(pack)
            t = canvas if name == "canvas" else DeviceTransform.train(ds, size)
            loader = make_loader(ds, batch_size, transform=t, seed=0, device=device)
            try:
                time_epoch(loader)  # warm-up: pages cached, threads started
                rates = []
                for _ in range(repeats):
                    n, s = time_epoch(loader)
                    rates.append(n / s)
            finally:
                close_loader(loader, ds)
            label = f"imgpack {mode} {side} {codec}, transform={name}"
            row = {"row": "storage", "label": label, "cache": "warm", **stat(rates).to_json(),
                   "mode": mode, "side": side, "codec": codec, "filter": filter,
                   "transform": name, "device": device or "cpu", "images": len(ds),
                   "pixel_bytes_per_image": pixels / len(ds),
                   "file_bytes_per_image": os.path.getsize(pack) / len(ds),
                   "yuv_to_rgb_on": None if codec == "raw" else (device or "cpu")}  # fmt: skip
            log(f"warm  {label}: {row['images_per_s']:,.0f} images/s")
            rows.append(row)
    return rows
