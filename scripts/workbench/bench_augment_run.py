"""The augmentation benchmark in one run: fidelity per photo set and storage rule, then timings.

``run_augment_bench`` makes the photo sets (``natives``: each distinct photograph
installed packages carry, as shipped; ``cuts``: ImageNet-sized and camera-sized
JPEGs cut from them), stores them each way (``bench_storage.store``), draws the
crops once per set and measures the PSNRs (``bench_augment``), then:

  resamplers  the two-matmul resample against ``affine_grid``/``grid_sample``
              (bilinear, and 4x supersampled then average-pooled: the cheapest
              antialias grid_sample allows) on the same records and boxes:
              PSNR against Pillow on the record, and images/s;
  speed       ``DeviceTransform.train``/``.eval`` images/s on device cpu (and
              cuda when present) at batch 64 and 128, the first stretch pack's
              records to 224.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from imgpack.reader.augment import random_resized_boxes
from imgpack.reader.resample import resample_boxes
from imgpack.reader.transform import DeviceTransform
from workbench.bench_augment import (
    FULL,
    QUICK,
    Crops,
    draw_crops,
    fidelity,
    make_natives,
    make_photos,
)
from workbench.bench_storage import Stored, store
from workbench.report import machine_info

__all__ = [
    "grid_sample_boxes",
    "compare_resamplers",
    "measure_set",
    "run_augment_bench",
    "time_transform",
]


def grid_sample_boxes(images: torch.Tensor, boxes: torch.Tensor, size: int, supersample: int = 1):
    """The same boxed resize with affine_grid + grid_sample (align_corners=False), 0..255 float.

    ``supersample`` k samples a (k*size)^2 grid and averages k x k blocks: an
    approximate antialias, since grid_sample itself has none.
    """
    b, _, h, w = images.shape
    x = images.float()
    bw, bh = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    theta = torch.zeros(b, 2, 3, dtype=torch.float32)
    theta[:, 0, 0] = (bw / w).float()
    theta[:, 0, 2] = ((2 * boxes[:, 0] + bw) / w - 1).float()
    theta[:, 1, 1] = (bh / h).float()
    theta[:, 1, 2] = ((2 * boxes[:, 1] + bh) / h - 1).float()
    n = size * supersample
    grid = F.affine_grid(theta.to(x.device), [b, x.shape[1], n, n], align_corners=False)
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    return F.avg_pool2d(out, supersample) if supersample > 1 else out


def _median_rate(fn, n_images: int, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return n_images / float(np.median(times))


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.double() - b.double()) ** 2).mean())
    return 99.0 if mse == 0 else 10 * math.log10(255.0**2 / mse)


def compare_resamplers(geo: Stored, size: int, batch: int, repeats: int) -> list[dict[str, Any]]:
    """PSNR against Pillow on the record, and images/s, for each resampler on the same boxes."""
    recs = np.stack([geo.records[i % len(geo.records)] for i in range(batch)])
    images = torch.from_numpy(recs).permute(0, 3, 1, 2)
    h, w = recs.shape[1:3]
    whole = torch.tensor([[0.0, 0.0, w, h]], dtype=torch.float64).repeat(batch, 1)
    boxes = random_resized_boxes(
        whole, (0.08, 1.0), (3 / 4, 4 / 3), torch.Generator().manual_seed(1)
    )
    ref = torch.stack([
        torch.from_numpy(np.asarray(Image.fromarray(recs[k]).resize(
            (size, size), Image.BILINEAR, box=tuple(boxes[k].tolist())), dtype=np.float64))
        for k in range(batch)
    ]).permute(0, 3, 1, 2)  # fmt: skip
    methods = {
        "matmul (Pillow weights)": lambda: resample_boxes(images, boxes, size),
        "grid_sample bilinear": lambda: grid_sample_boxes(images, boxes, size),
        "grid_sample 4x supersampled": lambda: grid_sample_boxes(images, boxes, size, 4),
    }
    rows = []
    for name, fn in methods.items():
        rows.append({"method": name, "size": size, "batch": batch,
                     "psnr_vs_pillow": round(_psnr(fn(), ref), 2),
                     "images_per_s": round(_median_rate(fn, batch, repeats), 1)})  # fmt: skip
    return rows


def time_transform(geo: Stored, device: str, batch: int, size: int, repeats: int) -> dict[str, Any]:
    """images/s of T(images, records) for train and eval, the batch already on ``device``."""
    recs = np.stack([geo.records[i % len(geo.records)] for i in range(batch)])
    images = torch.from_numpy(recs).permute(0, 3, 1, 2).to(device)
    idx = np.arange(batch) % len(geo.records)
    row: dict[str, Any] = {"device": device, "batch": batch, "record": list(recs.shape[1:3]),
                           "size": size}  # fmt: skip
    for kind, t in (("train", DeviceTransform.train(geo, size=size)),
                    ("eval", DeviceTransform.eval(geo, size=size))):  # fmt: skip
        row[f"{kind}_images_per_s"] = round(
            _median_rate(lambda t=t: t(images, idx), batch, repeats), 1
        )
    return row


def _files(folder: Path) -> list[str]:
    return sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*") if p.suffix in (".jpg", ".png")
    )


def _visible(stored: Stored) -> float:
    sizes = stored.source_sizes.astype(np.float64)
    sb = stored.source_boxes.astype(np.float64)
    return float(np.mean((sb[:, 2] - sb[:, 0]) * (sb[:, 3] - sb[:, 1]) / sizes.prod(1)))


def measure_set(name: str, folder: Path, cfg: dict[str, Any], work: Path, seed: int = 0,
                log: Callable[[str], None] = lambda _: None,
                ) -> tuple[list[dict[str, Any]], Stored | None]:  # fmt: skip
    """One photo set: every setting's row, and one uniform stretch pack for the timings."""
    files = _files(folder)
    crops = cfg["sets"][name].get("crops", cfg["crops"])
    cache: dict[bytes, tuple[Crops, Crops]] = {}
    rows, bench = [], None
    for s in cfg["settings"]:
        work.mkdir(parents=True, exist_ok=True)
        stored = store(folder, files, s, work)
        key = stored.source_sizes.tobytes() + stored.source_boxes.tobytes()
        if key not in cache:  # the same boxes and truths for every setting showing the same part
            cache[key] = (
                draw_crops(folder, files, stored, "train", cfg["train_size"], crops, seed),
                draw_crops(folder, files, stored, "eval", cfg["eval_size"], 1, seed),
            )
        train, evals = cache[key]
        rows.append({
            "photos": name, "images": len(files), "train_crops": len(train.idx),
            "mode": s.mode, "side": s.side, "filter": s.filter, "codec": s.codec,
            "source": stored.source, "bytes": stored.bytes, "file_bytes": stored.file_bytes,
            "visible": _visible(stored),
            "train": fidelity(stored, train), "eval": fidelity(stored, evals),
        })  # fmt: skip
        t = rows[-1]["train"]
        log(f"{name}: {s.mode} {s.side} {s.filter} {s.codec} ({stored.source}): "
            f"{stored.bytes:,.0f} B, train exact {t['exact_vs_orig']:.2f} dB")  # fmt: skip
        if bench is None and s.mode == "stretch":
            bench = stored
    return rows, bench


def _folder(name: str, spec: dict[str, Any], work: Path, seed: int) -> Path:
    if name == "natives":
        return make_natives(work / name, spec["count"], spec["max_side"])
    return make_photos(work / name, spec["normal"], spec["large"], seed=seed)


def run_augment_bench(
    work: str | Path,
    *,
    quick: bool = False,
    seed: int = 0,
    timings: bool = True,
    log: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Everything above; returns {"fidelity": [...], "resamplers": [...], "speed": [...], ...}."""
    cfg = QUICK if quick else FULL
    work = Path(work)
    rows, bench, sets = [], None, {}
    for name, spec in cfg["sets"].items():
        folder = _folder(name, spec, work / "photos", seed)
        set_rows, set_bench = measure_set(name, folder, cfg, work / f"packs-{name}", seed, log)
        rows += set_rows
        bench = bench or set_bench
        sets[name] = {**spec, "images": set_rows[0]["images"],
                      "train_crops": set_rows[0]["train_crops"]}  # fmt: skip
    repeats = 2 if quick else 5
    resamplers, speed = [], []
    if timings and bench is not None:
        for size in [32] if quick else [224, 160, 112]:
            resamplers += compare_resamplers(bench, size, 8 if quick else 64, repeats)
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        for dev in devices:
            for batch in [8] if quick else [64, 128]:
                speed.append(time_transform(bench, dev, batch, 32 if quick else 224, repeats))
    return {"sets": sets, "train_size": cfg["train_size"], "eval_size": cfg["eval_size"],
            "torch_threads": torch.get_num_threads(), "machine": machine_info(),
            "load_average": list(os.getloadavg()),
            "fidelity": rows, "resamplers": resamplers, "speed": speed}  # fmt: skip
