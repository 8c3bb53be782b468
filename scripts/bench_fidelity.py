#!/usr/bin/env python3
"""Fidelity: crops from a ``fit 360 yuv420`` pack beside FFCV's storage rule, same filter.

    python scripts/bench_fidelity.py --images 200            # ImageNet-like JPEGs, 224 crops
    python scripts/bench_fidelity.py --images 10 --fit 32 --crop 16              # a try

The same photographs (``common.make_folder``) are stored two ways, each resized once by
Pillow with the one ``--filter``, so the storage rule is the only difference:

* imgpack: ``pack-images --resize fit --size 360 --codec yuv420 --filter F`` (JPEG draft on,
  as the packer ships). Bytes: the ``.bin``'s size / images (labels, CRCs, paths included).
* FFCV's rule, emulated: the file decoded whole, aspect kept, longer side at most 256, sizes
  truncated (FFCV's ``astype(int)``), raw RGB. Bytes: w * h * 3 (its metadata not counted).

Crops are what a user's loader gives: ``make_loader(ds, 50, shuffle=False, seed=0,
transform=DeviceTransform.train(ds, S, flip=False), device="cpu")`` over ``--crops`` epochs
(train), and once with ``.eval(ds, S)``, the normalise undone to uint8. On a CPU the loader
normalises each batch in the loop's thread as it hands it over, so ``T.last_params["boxes"]``
then holds that batch's boxes in source pixels. Those boxes are scaled into FFCV's image and
cut from it and from the original decoded in full (the reference) by Pillow's antialiased
bilinear, the filter the reader implements. PSNR per image pools its train crops' squared
error; the table gives medians over images (the difference too: per image, then the median)
and bytes/image as means.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch
from common import OUT, machine, make_folder, pack, save, table
from PIL import Image

from imgpack import DeviceTransform, PackedImageDataset, make_loader

FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "lanczos": Image.LANCZOS}


def ffcv_rule(img: Image.Image, side: int, resample: int) -> Image.Image:
    """FFCV's ``max_resolution``: shrink (never enlarge) so the longer side is ``side``."""
    w, h = img.size
    ratio = side / max(w, h)
    if ratio >= 1:  # FFCV keeps smaller images as they are
        return img
    return img.resize((int(w * ratio), int(h * ratio)), resample)


def crops(img: Image.Image, boxes: np.ndarray, size: int, scale: tuple[float, float]):
    """Pillow's antialiased bilinear of each source box (l, t, r, b), scaled into ``img``."""
    f = np.array(scale * 2)
    return np.stack(
        [np.asarray(img.resize((size, size), Image.BILINEAR, box=tuple(b * f))) for b in boxes]
    ).astype(np.float64)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a - b) ** 2))
    return 10 * np.log10(255.0**2 / max(mse, 1e-10))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--large", action="store_true", help="camera-sized photographs")
    p.add_argument("--fit", type=int, default=360, help="imgpack's longer side (yuv420)")
    p.add_argument("--ffcv", type=int, default=256, help="FFCV's max_resolution")
    p.add_argument("--crop", type=int, default=224, help="the crops' side")
    p.add_argument("--crops", type=int, default=4, help="train crops per image")
    p.add_argument("--filter", default="bilinear", choices=sorted(FILTERS))
    a = p.parse_args()
    kind = "large" if a.large else "small"
    src = OUT / f"fidelity-src-{kind}-{a.images}"
    if not src.exists():
        make_folder(src, classes=10, per_class=max(1, a.images // 10), large=a.large)
    path = OUT / f"fidelity-{kind}-{a.images}-fit{a.fit}-{a.filter}.bin"
    fit = ("--resize", "fit", "--size", str(a.fit), "--codec", "yuv420", "--filter", a.filter)
    pack(src, path, *fit)
    ds = PackedImageDataset(path)
    mean, std = torch.tensor(ds.mean) * 255, torch.tensor(ds.std) * 255
    made: dict[str, list] = {"": [], "_e": []}  # suffix -> [(uint8 crops, boxes)] per batch
    for T, epochs, sfx in (
        (DeviceTransform.train(ds, a.crop, flip=False), a.crops, ""),
        (DeviceTransform.eval(ds, a.crop), 1, "_e"),
    ):
        loader = make_loader(ds, 50, shuffle=False, seed=0, transform=T, device="cpu")
        for _ in range(epochs):
            for images, _ in loader:
                pixels = (images.permute(0, 2, 3, 1) * std + mean).round().to(torch.uint8)
                made[sfx].append((pixels, T.last_params["boxes"].clone()))
        loader.close()
    n = len(ds)
    made = {s: [torch.cat(parts).numpy() for parts in zip(*v)] for s, v in made.items()}
    rows: dict[str, list[float]] = {k: [] for k in ("ours", "ffcv", "ours_e", "ffcv_e", "ffcv_b")}
    for i in range(n):
        original = Image.open(src / ds.source_path(i)).convert("RGB")
        ffcv = ffcv_rule(original, a.ffcv, FILTERS[a.filter])
        rows["ffcv_b"].append(ffcv.size[0] * ffcv.size[1] * 3)
        to_ffcv = (ffcv.size[0] / original.size[0], ffcv.size[1] / original.size[1])
        for sfx, (pixels, boxes) in made.items():  # image i's crops: i, n + i, 2n + i...
            truth = crops(original, boxes[i::n], a.crop, (1.0, 1.0))
            rows["ours" + sfx].append(psnr(pixels[i::n].astype(np.float64), truth))
            rows["ffcv" + sfx].append(psnr(crops(ffcv, boxes[i::n], a.crop, to_ffcv), truth))
    ours_b = path.stat().st_size / len(ds)
    ffcv_b = statistics.mean(rows.pop("ffcv_b"))
    med = {k: statistics.median(v) for k, v in rows.items()}
    gain = {
        s: statistics.median(o - f for o, f in zip(rows["ours" + s], rows["ffcv" + s]))
        for s in ("", "_e")
    }
    print(machine())
    print(
        f"{len(ds)} {kind} photographs, filter {a.filter}, {a.crop}x{a.crop} crops "
        f"({a.crops} train + 1 eval per image), PSNR vs the original: medians over images"
    )
    header = ["storage", "bytes/image", "train crops, dB", "eval crop, dB"]
    print(
        table(
            header,
            [
                [f"imgpack fit {a.fit} yuv420", round(ours_b), med["ours"], med["ours_e"]],
                [f"FFCV's rule, {a.ffcv} raw", round(ffcv_b), med["ffcv"], med["ffcv_e"]],
                ["difference", f"{ours_b / ffcv_b:.2f}x", f"{gain['']:+.2f}", f"{gain['_e']:+.2f}"],
            ],
        )
    )
    save(
        "bench_fidelity",
        {"args": vars(a), "bytes": {"imgpack": ours_b, "ffcv": ffcv_b}, "median": med,
         "gain_db": {"train": gain[""], "eval": gain["_e"]}},
    )  # fmt: skip


if __name__ == "__main__":
    main()
