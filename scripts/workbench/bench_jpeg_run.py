"""The JPEG benchmark in one run: photos, table (a) and the scale-aware rows, then (b) and (c).

``run_jpeg_bench`` cuts the photographs (``bench_augment.make_photos``: ImageNet-sized
JPEGs plus a few camera-sized ones), measures fidelity per storage row
(``bench_jpeg_quality``), then packs them once with the packer (``--resize fit --size S
--codec jpeg --quality Q``) and times decoding and delivery on that pack
(``bench_jpeg_speed``). Everything lands in one JSON-ready dict with the machine and the
load average before and after (other jobs on the machine show there).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg
import torch

from imgpack.packer.pack import pack_folder
from imgpack.reader.dataset import PackedImageDataset
from workbench.bench_augment import make_photos
from workbench.bench_jpeg_quality import FULL, QUICK, quality_rows, scaled_rows
from workbench.bench_jpeg_speed import decode_table, delivery_table
from workbench.report import machine_info

__all__ = ["SPEED", "QUICK_SPEED", "jpeg_pack", "run_jpeg_bench"]

SPEED = {"side": 512, "quality": 90, "threads": (1, 2), "decode_repeats": 11, "batch": 64,
         "size": 224, "epochs": 7}  # fmt: skip
QUICK_SPEED = {"side": 96, "quality": 90, "threads": (1, 2), "decode_repeats": 2, "batch": 2,
               "size": 32, "epochs": 2}  # fmt: skip


def jpeg_pack(folder: Path, out: Path, side: int, quality: int) -> tuple[PackedImageDataset, int]:
    """The packer's ``--resize fit --size side --codec jpeg --quality quality`` pack of the
    photos, opened, and how many records it stored as they came."""
    summary = pack_folder(folder, out, size=(side, side), resize="fit", filter="bilinear",
                          codec="jpeg", quality=quality, force=True, progress=False)  # fmt: skip
    return PackedImageDataset(out), int(summary.index["jpeg"]["stored_as_is"])


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.jpg"))


def run_jpeg_bench(work: str | Path, *, quick: bool = False, seed: int = 0,
                   fidelity: bool = True, speed: bool = True,
                   log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:  # fmt: skip
    """Tables (a), (b), (c) on one photo set; returns the JSON-ready result."""
    cfg, sp = (QUICK, QUICK_SPEED) if quick else (FULL, SPEED)
    work = Path(work)
    load_before = list(os.getloadavg())
    if (work / "photos").is_dir():  # a kept --work: make_photos would add to the old set
        shutil.rmtree(work / "photos")
    folder = make_photos(work / "photos", cfg["normal"], cfg["large"], seed=seed)
    files = _files(folder)
    log(f"{len(files)} photos in {folder}")
    result: dict[str, Any] = {
        "photos": {"normal": cfg["normal"], "large": cfg["large"], "images": len(files)},
        "config": {**{k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
                   "speed": {k: list(v) if isinstance(v, tuple) else v for k, v in sp.items()}},
        "machine": machine_info(), "simplejpeg": simplejpeg.__version__,
        "torch_threads": torch.get_num_threads(), "load_before": load_before,
        "quality": [], "scaled": [], "decode": [], "delivery": [],
    }  # fmt: skip
    if fidelity:
        (work / "packs").mkdir(parents=True, exist_ok=True)
        rows, state = quality_rows(folder, files, cfg, work / "packs", seed, log)
        result["quality"] = rows
        result["scaled"] = scaled_rows(folder, files, cfg, state, seed, log)
    if speed:
        ds, kept = jpeg_pack(folder, work / "speed.bin", sp["side"], sp["quality"])
        try:
            result["records"] = {"count": len(ds), "side": sp["side"], "quality": sp["quality"],
                                 "stored_as_is": kept,
                                 "bytes": float(np.mean(ds.index.record_lengths)),
                                 "pixels": float(np.mean(ds.record_sizes.prod(1)))}  # fmt: skip
            log(f"records: {result['records']}")
            result["decode"] = decode_table(ds, sp["threads"], sp["batch"], sp["decode_repeats"])
            for r in result["decode"]:
                log(f"decode {r['decoder']} x{r['threads']}: {r['images_per_s']:,.0f} images/s")
            result["delivery"] = delivery_table(ds, sp["threads"], sp["batch"], sp["size"],
                                                sp["epochs"], seed)  # fmt: skip
        finally:
            ds.close()
        for r in result["delivery"]:
            log(f"delivery x{r['threads']}: imgpack {r['imgpack_images_per_s']:,.0f}, "
                f"FFCV {r['ffcv_images_per_s']:,.0f} images/s ({r['ratio']:.2f}x)")  # fmt: skip
    result["load_after"] = list(os.getloadavg())
    return result
