#!/usr/bin/env python3
"""GPU proof: the same ResNet-50 training step fed by the per-file PIL loader and by imgpack.

From the repository root of a CUDA machine (one GPU, 16 cores), about 3 minutes:

    python scripts/gpu_proof.py --dry-run --device cuda && python scripts/gpu_proof.py

The first command runs every CUDA path in seconds (a tiny model, a tiny sample); the second is
the proof: a generated 100-class sample of (warm-up + steps) x batch JPEGs packed at 224x224,
then 20 warm-up and 200 measured steps of 256 images per loader: the per-file DataLoader
(Pillow decode, resize, centre crop in worker processes), ``make_loader(ds, B, device=dev)``
(a batch ahead, moved on a side stream), and the pack held on the device (``resident=True``:
no CPU thread and no host-to-device copy in the step). Each side normalises on the device and
runs the same step; ``watch(sync=torch.cuda.synchronize)`` times the wait for data on the
GPU's clock. ``--dry-run`` alone runs on the CPU in seconds (the tests do that).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from common import OUT, machine, make_folder, pack, save, table
from demo import per_file_loader
from torch import nn

from imgpack import PackedImageDataset, make_loader, watch


class Bottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, stride: int) -> None:
        super().__init__()
        cout = mid * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False),
            nn.BatchNorm2d(mid),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid, mid, 3, stride, 1, bias=False),
            nn.BatchNorm2d(mid),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.skip = nn.Identity()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.skip(x))


def resnet(blocks: tuple[int, ...], classes: int, width: int = 64) -> nn.Module:
    """ResNet-50 with blocks (3, 4, 6, 3) and width 64 (25.6 M parameters at 1000 classes)."""
    layers = [
        nn.Conv2d(3, width, 7, 2, 3, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = width
    for stage, n in enumerate(blocks):
        for k in range(n):
            mid = width * 2**stage
            layers.append(Bottleneck(cin, mid, 2 if k == 0 and stage else 1))
            cin = mid * 4
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


def run(loader, model, opt, dev, mean, std, warmup: int, steps: int) -> dict:
    """``warmup`` untimed steps, then ``steps`` timed ones; images/s and the data wait."""
    sync = torch.cuda.synchronize if dev.type == "cuda" else None
    batches = (b for _ in range(10**9) for b in loader)  # epochs back to back
    for _ in range(warmup):
        images, labels = next(batches)
        step(model, opt, images, labels, dev, mean, std)
    watched = watch(
        (next(batches) for _ in range(steps + 1)), log=lambda s: None, progress=False, sync=sync
    )
    for images, labels in watched:
        step(model, opt, images, labels, dev, mean, std)
    s = watched.summary()
    return {"images_per_s": s.images_per_s, "data_wait": s.data_wait_fraction}


def step(model, opt, images, labels, dev, mean, std) -> None:
    x = images.to(dev, non_blocking=True).float().sub_(mean).div_(std)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        loss = F.cross_entropy(
            model(x.contiguous(memory_format=torch.channels_last)),
            labels.to(dev, non_blocking=True),
        )
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", help="default: cuda (cpu with --dry-run)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--dry-run", action="store_true", help="a tiny model and sample")
    a = p.parse_args()
    if a.dry_run:
        a.steps, a.warmup, a.batch_size = 3, 1, 4
    dev = torch.device(a.device or ("cpu" if a.dry_run else "cuda"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"gpu_proof: no CUDA device (torch {torch.__version__})")
    classes, size = (2, 32) if a.dry_run else (100, 224)
    per_class = -(-(a.warmup + a.steps + 1) * a.batch_size // classes)
    work = OUT / ("gpu-proof-dry" if a.dry_run else "gpu-proof")
    if not (work / "p.bin").exists():
        make_folder(work / "src", classes=classes, per_class=per_class)
        pack(work / "src", work / "p.bin", "--size", str(size))
    ds = PackedImageDataset(work / "p.bin")
    mean = torch.tensor(ds.mean, device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor(ds.std, device=dev).view(1, 3, 1, 1) * 255
    workers = max(1, min(8, len(os.sched_getaffinity(0)) // 2))
    loaders = {
        "per-file PIL (DataLoader)": lambda: per_file_loader(
            work / "src", size, a.batch_size, workers, pin=dev.type == "cuda"
        ),
        "imgpack": lambda: make_loader(ds, a.batch_size, drop_last=True, device=dev),
        "imgpack resident": lambda: make_loader(
            ds, a.batch_size, drop_last=True, device=dev, resident=True
        ),
    }
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
    results = {}
    for name, make in loaders.items():
        torch.manual_seed(0)  # the same initial weights for every loader
        model = (resnet((1, 1), 10, 8) if a.dry_run else resnet((3, 4, 6, 3), 1000)).to(dev)
        model = model.to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loader = make()
        t0 = time.perf_counter()
        results[name] = run(loader, model, opt, dev, mean, std, a.warmup, a.steps)
        results[name]["seconds"] = time.perf_counter() - t0
        getattr(loader, "close", lambda: None)()
        del loader
    ds.close()
    base = results["per-file PIL (DataLoader)"]["images_per_s"] or float("nan")
    print(machine(), torch.cuda.get_device_name(dev) if dev.type == "cuda" else "no GPU")
    print(f"{a.steps} steps of {a.batch_size} images at {size}x{size}, after {a.warmup} warm-up")
    print(
        table(
            ["loader", "images/s", "data wait", "vs per-file"],
            [
                [
                    name,
                    round(r["images_per_s"] or 0),
                    f"{r['data_wait'] or 0:.1%}",
                    f"{(r['images_per_s'] or 0) / base:.2f}x",
                ]
                for name, r in results.items()
            ],
        )
    )
    save("gpu_proof", {"dry_run": a.dry_run, **results})


if __name__ == "__main__":
    main()
