#!/usr/bin/env python3
"""No GPU: training and eval crops made on a CPU, beside FFCV's CPU pipeline to the same batch.

    python scripts/bench_crops.py                   # 2,000 photographs, jpeg fit 256, 224 crops
    python scripts/bench_crops.py --images 40 --size 32 --batch-size 8 --repeats 1       # a try

One pack (``--codec`` jpeg by default, ``--resize fit --size 256``), batch 256, warm page
cache. imgpack's rows are ``make_loader(ds, B, transform=DeviceTransform.train(ds, S),
device="cpu")`` (and ``.eval``): the loader's threads cut, resample and normalise each crop
into the float batch. FFCV's rows (``ffcv_like.py``) decode FFCV's own JPEGs of the same
records whole, crop and resize with OpenCV into a uint8 batch, and flip and normalise it to
the same float batch; "FFCV, uint8" stops before the normalise. The rows alternate, one epoch
each, ``--repeats`` times: medians.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from common import OUT, alternate, machine, make_folder, pack, save, table
from ffcv_like import FfcvLike, centre_boxes, jpeg_streams, random_boxes

from imgpack import DeviceTransform, PackedImageDataset, make_loader


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--codec", default="jpeg", choices=["jpeg", "raw", "yuv420"])
    p.add_argument("--fit", type=int, default=256, help="the pack's longer side")
    p.add_argument("--size", type=int, default=224, help="the crops' side")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    threads = len(os.sched_getaffinity(0))
    src = OUT / f"crops-src-{a.images}"
    if not src.exists():
        make_folder(src, classes=10, per_class=max(1, a.images // 10))
    path = OUT / f"crops-{a.codec}-{a.fit}-{a.images}.bin"
    if not path.exists():
        pack(src, path, "--resize", "fit", "--size", str(a.fit), "--codec", a.codec)
    ds = PackedImageDataset(path)
    streams, sizes = jpeg_streams(ds)
    rng = np.random.default_rng(0)
    loaders = {
        kind: make_loader(ds, a.batch_size, transform=T, device="cpu")
        for kind, T in (
            ("train", DeviceTransform.train(ds, size=a.size)),
            ("eval", DeviceTransform.eval(ds, size=a.size)),
        )
    }

    def ours(kind: str):
        def epoch() -> float:
            n, t0 = 0, time.perf_counter()
            for images, _ in loaders[kind]:
                n += len(images)
            return n / (time.perf_counter() - t0)

        return epoch

    def theirs(kind: str, floats: bool):
        run = FfcvLike(streams, sizes, a.size, threads, ds.mean, ds.std, floats)

        def epoch() -> float:
            order = rng.permutation(len(ds)) if kind == "train" else np.arange(len(ds))
            n, t0 = 0, time.perf_counter()
            for start in range(0, len(order), a.batch_size):
                idx = order[start : start + a.batch_size]
                shapes = [sizes[i] for i in idx]
                if kind == "train":
                    boxes, flips = random_boxes(shapes, rng), rng.random(len(idx)) < 0.5
                else:
                    boxes, flips = centre_boxes(shapes, a.size), np.zeros(len(idx), bool)
                n += len(run(idx, boxes, flips))
            return n / (time.perf_counter() - t0)

        return epoch

    got = alternate(
        {
            "imgpack train": ours("train"),
            "FFCV train, float": theirs("train", True),
            "FFCV train, uint8": theirs("train", False),
            "imgpack eval": ours("eval"),
            "FFCV eval, float": theirs("eval", True),
        },
        a.repeats,
    )
    m = {k: v["median"] for k, v in got.items()}
    for loader in loaders.values():
        loader.close()
    print(machine())
    print(
        f"{len(ds)} records, {a.codec} fit {a.fit}, {a.size}x{a.size} crops, batch "
        f"{a.batch_size}, {threads} threads, warm page cache, medians of {a.repeats} epochs"
    )
    print(
        table(
            ["crops", "imgpack, float", "FFCV, float", "ratio", "FFCV, uint8"],
            [
                [
                    "train (RandomResizedCrop + flip)",
                    round(m["imgpack train"]),
                    round(m["FFCV train, float"]),
                    f"{m['imgpack train'] / m['FFCV train, float']:.2f}x",
                    round(m["FFCV train, uint8"]),
                ],
                [
                    "eval (Resize + CenterCrop)",
                    round(m["imgpack eval"]),
                    round(m["FFCV eval, float"]),
                    f"{m['imgpack eval'] / m['FFCV eval, float']:.2f}x",
                    "",
                ],
            ],
        )
    )
    save("bench_crops", got)


if __name__ == "__main__":
    main()
