#!/usr/bin/env python3
"""The three codecs on a CPU: bytes per image, and records to an RGB batch, beside FFCV's JPEG
pipeline on the same records.

    python scripts/bench_codecs.py                  # 2,000 photographs, fit 256, batch 256
    python scripts/bench_codecs.py --images 40 --fit 48 --batch-size 8 --repeats 1       # a try

The same photographs packed three ways (``--resize fit --size 256``: raw, yuv420, jpeg q90),
each delivered as the uint8 RGB batch a device transform takes (``make_loader(ds, B,
transform=lambda images, records: images, device="cpu")``: raw records copied, yuv420 ones
converted and jpeg ones decoded by the loader's threads), beside FFCV's loader on FFCV's own
JPEGs of the same records (``ffcv_like.py``: each decoded whole, its training box resized by
OpenCV into the uint8 batch). The rows alternate, one epoch each, ``--repeats`` times:
medians.

``--device cuda`` adds the claim for a GPU: jpeg records to training crops on the device,
``make_loader(ds, B, transform=DeviceTransform.train(ds, 224), device="cuda")`` (the loader
decodes each record at the scale its crop needs; the device crops and resamples), beside
FFCV's uint8 crops copied to the device.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from common import OUT, alternate, machine, make_folder, pack, save, table
from ffcv_like import FfcvLike, jpeg_streams, random_boxes

from imgpack import DeviceTransform, PackedImageDataset, make_loader

CODECS = ("raw", "yuv420", "jpeg")


def as_gathered(images, records):
    return images  # records of many sizes: the batch as the loader delivers it


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--fit", type=int, default=256)
    p.add_argument("--crop", type=int, default=224, help="FFCV's crops' side")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", help="also time jpeg records to crops on this device (cuda)")
    a = p.parse_args()
    src = OUT / f"crops-src-{a.images}"
    if not src.exists():
        make_folder(src, classes=10, per_class=max(1, a.images // 10))
    sets = {}
    for codec in CODECS:
        path = OUT / f"crops-{codec}-{a.fit}-{a.images}.bin"
        if not path.exists():
            pack(src, path, "--resize", "fit", "--size", str(a.fit), "--codec", codec)
        sets[codec] = PackedImageDataset(path)
    loaders = {
        c: make_loader(ds, a.batch_size, transform=as_gathered, device="cpu")
        for c, ds in sets.items()
    }
    if a.device:
        T = DeviceTransform.train(sets["jpeg"], a.crop)
        loaders["device"] = make_loader(sets["jpeg"], a.batch_size, transform=T, device=a.device)
    streams, sizes = jpeg_streams(sets["jpeg"])
    threads = len(os.sched_getaffinity(0))
    ffcv = FfcvLike(streams, sizes, a.crop, threads, (0, 0, 0), (1, 1, 1), floats=False)
    rng = np.random.default_rng(0)

    def ours(codec: str):
        def epoch() -> float:
            n, t0 = 0, time.perf_counter()
            for images, _ in loaders[codec]:
                n += len(images)
            return n / (time.perf_counter() - t0)

        return epoch

    def theirs(device=None):
        def epoch() -> float:
            order, n, t0 = rng.permutation(len(sizes)), 0, time.perf_counter()
            for start in range(0, len(order), a.batch_size):
                idx = order[start : start + a.batch_size]
                boxes = random_boxes([sizes[i] for i in idx], rng)
                images = ffcv(idx, boxes, rng.random(len(idx)) < 0.5)
                n += len(images.to(device) if device else images)
            return n / (time.perf_counter() - t0)

        return epoch

    sides = {**{c: ours(c) for c in CODECS}, "FFCV": theirs()}
    if a.device:
        sides.update({"device": ours("device"), "FFCV device": theirs(a.device)})
    got = alternate(sides, a.repeats)
    m = {k: v["median"] for k, v in got.items()}
    rows = []
    for codec, ds in sets.items():
        per_image = os.path.getsize(ds.path) / len(ds)
        rows.append(
            [
                f"{codec}, imgpack",
                round(per_image),
                round(m[codec]),
                f"{m[codec] / m['raw']:.2f}x",
                f"{m[codec] / m['FFCV']:.2f}x",
            ]
        )
    rows.append(
        [
            "jpeg q90, FFCV's loader, crops",
            round(sum(map(len, streams)) / len(streams)),
            round(m["FFCV"]),
            f"{m['FFCV'] / m['raw']:.2f}x",
            "1.00x",
        ]
    )
    if a.device:
        ratio = f"{m['device'] / m['FFCV device']:.2f}x"
        rows.append(
            [f"jpeg to training crops on {a.device}, imgpack", "", round(m["device"]), "", ratio]
        )
        rows.append(
            [
                f"FFCV's loader, uint8 crops copied to {a.device}",
                "",
                round(m["FFCV device"]),
                "",
                "1.00x",
            ]
        )
    for loader in loaders.values():
        loader.close()
    print(machine())
    print(
        f"{a.images} photographs, fit {a.fit}, batch {a.batch_size}, {threads} threads, "
        f"warm page cache, medians of {a.repeats} epochs; uint8 RGB batches"
    )
    print(table(["records", "bytes/image", "images/s", "vs raw", "vs FFCV"], rows))
    save("bench_codecs", got)


if __name__ == "__main__":
    main()
