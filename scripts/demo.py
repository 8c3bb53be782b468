#!/usr/bin/env python3
"""The main job end to end: a sample folder, packed, then the same simulated training fed by
per-file decoding and by imgpack, side by side. ``bash scripts/demo.sh`` installs and runs it.

    python scripts/demo.py [WORK] [--classes 10 --per-class 100 --batch-size 64 --step-ms 20]

The training step sleeps ``--step-ms`` per batch. A GPU step leaves the host CPU free, and so
does a sleep, so the loader gets the cores it would get in real training; a CPU matmul would
fight the loader for them and mostly measure the core count. 20 ms per batch of 64 is about a
ResNet-50 step on one current data-centre GPU with mixed precision.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
from common import make_folder, pack
from PIL import Image

from imgpack import PackedImageDataset, make_loader, watch


class PerFile(torch.utils.data.Dataset):
    """What most training code does today: open, decode, resize and centre-crop one file per
    sample with Pillow (torchvision's ``Resize(size)`` + ``CenterCrop(size)``)."""

    def __init__(self, root: Path, size: int) -> None:
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.files = [(f, k) for k, c in enumerate(classes) for f in sorted((root / c).iterdir())]
        self.size = size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        path, label = self.files[i]
        s = self.size
        with Image.open(path) as img:
            w, h = img.size
            scale = s / min(w, h)
            img = img.convert("RGB").resize((max(s, int(w * scale)), max(s, int(h * scale))))
            left, top = round((img.width - s) / 2), round((img.height - s) / 2)
            img = img.crop((left, top, left + s, top + s))
        return torch.from_numpy(np.array(img)).permute(2, 0, 1), label


def per_file_loader(src: Path, size: int, batch_size: int, workers: int, pin: bool = False):
    """The usual DataLoader over ``PerFile``: the baseline of the demo and the GPU proof."""
    return torch.utils.data.DataLoader(
        PerFile(src, size),
        batch_size,
        shuffle=True,
        num_workers=workers,
        prefetch_factor=4,
        persistent_workers=True,
        drop_last=True,
        pin_memory=pin,
    )


def train(loader, epochs: int, step_s: float):
    """Simulated training with the meter on, over every epoch; its summary."""

    def batches():
        for _ in range(epochs):
            yield from loader

    watched = watch(batches(), log=lambda line: None, progress=False)
    for _ in watched:
        time.sleep(step_s)  # the "GPU step": the host CPU stays free
    return watched.summary()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work", nargs="?", type=Path, default=Path("demo-data"))
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--per-class", type=int, default=100)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--epochs", type=int, default=2)
    a = p.parse_args()
    src, out = a.work / "images", a.work / "train.bin"
    print(f"== making {a.classes * a.per_class} sample JPEGs in {src}", flush=True)
    make_folder(src, classes=a.classes, per_class=a.per_class)
    print(f"== packing them into {out}", flush=True)
    pack(src, out, "--size", str(a.size))
    step_s = a.step_ms / 1000
    workers = max(1, min(4, (os.cpu_count() or 2) // 2))  # the usual starting point
    print("== training on per-file JPEGs (DataLoader, Pillow)", flush=True)
    per_file = per_file_loader(src, a.size, a.batch_size, workers)
    base = train(per_file, a.epochs, step_s)
    del per_file
    print("== training on the pack (make_loader)", flush=True)
    with PackedImageDataset(out) as ds:
        loader = make_loader(ds, a.batch_size)
        fast = train(loader, a.epochs, step_s)
        loader.close()
    print(f"simulated training: {a.step_ms:g} ms per batch of {a.batch_size}")
    print(f"{'loader':<34} {'images/s':>10} {'data wait':>10} {'first batch':>12}")
    for name, s in (("per-file PIL decode (DataLoader)", base), ("imgpack (make_loader)", fast)):
        rate, wait = s.images_per_s or 0, s.data_wait_fraction or 0
        print(f"{name:<34} {rate:>10,.0f} {wait:>10.0%} {s.first_batch_s or 0:>10.2f} s")
    speedup = (fast.images_per_s or 0) / (base.images_per_s or float("inf"))
    print(
        f"speed-up: {speedup:.1f}x images/s; the GPU waits for data "
        f"{base.data_wait_fraction or 0:.0%} of the time with per-file decoding, "
        f"{fast.data_wait_fraction or 0:.0%} with imgpack"
    )


if __name__ == "__main__":
    main()
