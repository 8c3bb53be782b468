"""The CPU kernels' benchmark in one run: photographs, three packs of them, tables (a)-(d).

``run_cpu_kernels`` cuts ImageNet-sized photographs (``workbench.sample``), packs them three
ways with the packer (``--resize fit``: raw at ``raw_side``, yuv420 at ``yuv_side``, jpeg at
``jpeg_side`` and ``quality``), then measures (a) yuv420 to RGB beside copying raw records
(``workbench.cpu_yuv``), (b) the crop resamplers per crop, speed and fidelity, (c) the whole
CPU crop path against FFCV's and (d) the per-batch normalise (``workbench.cpu_crops``).
Everything lands in one JSON-ready dict with the machine and its load average before and
after (other jobs on a shared machine show there).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import PIL
import simplejpeg
import torch

from imgpack.packer.pack import pack_folder
from imgpack.reader.dataset import PackedImageDataset
from workbench.cpu_candidates import RESIZE_NAME
from workbench.cpu_crops import candidate_table, draws, normalise_table, path_table
from workbench.cpu_yuv import numba_version, read_records, yuv_table
from workbench.report import machine_info
from workbench.sample import make_sample_folder

__all__ = ["FULL", "QUICK", "run_cpu_kernels"]

FULL = {"photos": 256, "raw_side": 256, "yuv_side": 362, "jpeg_side": 256, "quality": 90,
        "size": 224, "batch": 64, "threads": (1, 2), "repeats": 11, "crop_photos": 64,
        "crop_repeats": 7}  # fmt: skip
QUICK = {"photos": 6, "raw_side": 48, "yuv_side": 68, "jpeg_side": 64, "quality": 90,
         "size": 32, "batch": 4, "threads": (1, 2), "repeats": 2, "crop_photos": 6,
         "crop_repeats": 1}  # fmt: skip


def _pack(folder: Path, out: Path, side: int, **codec: Any) -> Path:
    pack_folder(folder, out, size=(side, side), resize="fit", filter="bilinear", force=True,
                progress=False, **codec)  # fmt: skip
    return out


def run_cpu_kernels(work: str | Path, *, quick: bool = False, seed: int = 0,
                    log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:  # fmt: skip
    """Tables (a)-(d) on one photo set; returns the JSON-ready result."""
    cfg = QUICK if quick else FULL
    work = Path(work)
    load_before = list(os.getloadavg())
    if (work / "photos").is_dir():  # a kept --work: start from a fresh set
        shutil.rmtree(work / "photos")
    folder = make_sample_folder(work / "photos", classes=1, per_class=cfg["photos"], seed=seed)
    raw = _pack(folder, work / "raw.bin", cfg["raw_side"])
    yuv = _pack(folder, work / "yuv.bin", cfg["yuv_side"], codec="yuv420")
    jpeg = _pack(folder, work / "jpeg.bin", cfg["jpeg_side"], codec="jpeg", quality=cfg["quality"])
    log(f"{cfg['photos']} photos packed in {work}")
    result: dict[str, Any] = {
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
        "machine": machine_info(), "numba": numba_version(), "pillow": PIL.__version__,
        "ffcv_resize": RESIZE_NAME,
        "simplejpeg": simplejpeg.__version__, "torch_threads": torch.get_num_threads(),
        "load_before": load_before,
    }  # fmt: skip
    threads, repeats = tuple(cfg["threads"]), cfg["repeats"]
    result["yuv"] = yuv_table(read_records(yuv), read_records(raw), threads, cfg["batch"], repeats)
    log("(a) done")
    ds = PackedImageDataset(jpeg)
    try:
        plans = draws(ds, cfg["size"], cfg["batch"], seed)
        few = -(-cfg["crop_photos"] // cfg["batch"])  # the batches of the first crop_photos
        some = {kind: plan[:few] for kind, plan in plans.items()}
        result["candidates"] = candidate_table(ds, folder, some, cfg["crop_repeats"])
        log("(b) done")
        result["path"] = [{"kind": kind, **row} for kind, plan in plans.items()
                          for row in path_table(ds, kind, plan, threads, repeats)]  # fmt: skip
        log("(c) done")
    finally:
        ds.close()
    result["normalise"] = normalise_table(cfg["batch"], cfg["size"], threads, repeats)
    result["load_after"] = list(os.getloadavg())
    return result
