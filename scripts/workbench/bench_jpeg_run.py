"""The JPEG benchmark in one run: photos, table (a) and the scale-aware rows, then (b) and (c).

``run_jpeg_bench`` cuts the photographs (``bench_augment.make_photos``: ImageNet-sized
JPEGs plus a few camera-sized ones), measures fidelity per storage row
(``bench_jpeg_quality``), then builds one set of records (``--resize fit --size S --codec
jpeg`` at quality Q, the packer's own pack when it writes jpeg) and times decoding and
delivery on them (``bench_jpeg_speed``). Everything lands in one JSON-ready dict with the
machine, the load average before and after, and which code the "imgpack" rows ran.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from imgpack.reader.augment import Geometry
from workbench.bench_augment import make_photos
from workbench.bench_jpeg_quality import FULL, QUICK, as_is, quality_rows, resized, scaled_rows
from workbench.bench_jpeg_speed import Records, decode_table, delivery_table
from workbench.jpeg_decoders import encode, reader_jpeg
from workbench.report import machine_info

__all__ = ["SPEED", "QUICK_SPEED", "encoded_records", "run_jpeg_bench"]

SPEED = {"side": 512, "quality": 90, "threads": (1, 2), "decode_repeats": 7, "batch": 64,
         "size": 224, "epochs": 5}  # fmt: skip
QUICK_SPEED = {"side": 96, "quality": 90, "threads": (1, 2), "decode_repeats": 2, "batch": 2,
               "size": 32, "epochs": 2}  # fmt: skip


def encoded_records(folder: Path, files: list[str], side: int, quality: int) -> Records:
    """The records ``--resize fit --size side --codec jpeg --quality quality`` stores:
    sources that qualify kept as they came, the rest encoded by Pillow (4:2:0)."""
    images, geos = resized(folder, files, side)
    bufs, kept = [], 0
    for f, img in zip(files, images):
        own = as_is(folder / f, img)
        kept += own is not None
        bufs.append(own if own is not None else encode(img, quality))
    sizes = np.asarray([img.size for img in images], dtype=np.int64)
    geometry = Geometry(
        torch.tensor([g.source_size for g in geos], dtype=torch.float64),
        torch.tensor([g.source_box for g in geos], dtype=torch.float64),
        torch.tensor([g.content_box for g in geos], dtype=torch.float64),
        torch.from_numpy(sizes),
    )
    why = f"encoded as --codec jpeg would ({kept} kept as they came); no jpeg pack"
    return Records(bufs, sizes, geometry, why)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.jpg"))


def run_jpeg_bench(work: str | Path, *, quick: bool = False, seed: int = 0,
                   fidelity: bool = True, speed: bool = True,
                   log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:  # fmt: skip
    """Tables (a), (b), (c) on one photo set; returns the JSON-ready result."""
    cfg, sp = (QUICK, QUICK_SPEED) if quick else (FULL, SPEED)
    work = Path(work)
    load_before = list(os.getloadavg())
    folder = make_photos(work / "photos", cfg["normal"], cfg["large"], seed=seed)
    files = _files(folder)
    log(f"{len(files)} photos in {folder}")
    jpeg = reader_jpeg()
    result: dict[str, Any] = {
        "photos": {"normal": cfg["normal"], "large": cfg["large"], "images": len(files)},
        "config": {**{k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
                   "speed": {k: list(v) if isinstance(v, tuple) else v for k, v in sp.items()}},
        "decoder_module": jpeg.__name__, "machine": machine_info(),
        "torch_threads": torch.get_num_threads(), "load_before": load_before,
        "quality": [], "scaled": [], "decode": [], "delivery": [],
    }  # fmt: skip
    if fidelity:
        (work / "packs").mkdir(parents=True, exist_ok=True)
        rows, state = quality_rows(folder, files, cfg, work / "packs", seed, log)
        result["quality"] = rows
        result["scaled"] = scaled_rows(folder, files, cfg, state, jpeg, seed, log)
    if speed:
        rec = encoded_records(folder, files, sp["side"], sp["quality"])
        result["records"] = {"origin": rec.origin, "count": len(rec.bufs),
                             "side": sp["side"], "quality": sp["quality"],
                             "bytes": float(np.mean([len(b) for b in rec.bufs])),
                             "pixels": float(np.mean(rec.sizes.prod(1)))}  # fmt: skip
        log(f"records: {result['records']}")
        result["decode"] = decode_table(rec, sp["threads"], sp["decode_repeats"])
        for r in result["decode"]:
            log(f"decode {r['decoder']} x{r['threads']}: {r['images_per_s']:,.0f} images/s")
        result["delivery"] = delivery_table(rec, sp["threads"], sp["batch"], sp["size"],
                                            sp["epochs"], seed)  # fmt: skip
        for r in result["delivery"]:
            log(f"delivery x{r['threads']}: imgpack {r['imgpack_images_per_s']:,.0f}, "
                f"FFCV {r['ffcv_images_per_s']:,.0f} images/s ({r['ratio']:.2f}x)")  # fmt: skip
    result["load_after"] = list(os.getloadavg())
    return result
