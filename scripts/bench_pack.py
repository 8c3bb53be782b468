#!/usr/bin/env python3
"""Packing: ``pack-images`` beside FFCV's writer, on the same photographs, same workers.

    python scripts/bench_pack.py                    # 1,000 ImageNet-like JPEGs, 1 and all cores
    python scripts/bench_pack.py --images 40 --repeats 1                                 # a try

Both sides store what FFCV stores by default: each image whole, its longer side at most
``--size`` (256), raw RGB pixels (``pack-images --resize fit --size 256``; FFCV's
``RGBImageField(write_mode="raw", max_resolution=256)``). Where ``ffcv`` is installed its
``DatasetWriter`` runs; elsewhere its writer is emulated as it runs: each worker process
decodes the whole image with Pillow (``np.asarray(Image.open(...).convert("RGB"))``), shrinks
it with ``cv2.resize(INTER_AREA)`` (``ffcv_like.resize``) and appends the pixels to its own
pages (a file per worker here). The source files are read once before timing (warm page
cache: CPU work, not the disk); the sides alternate, ``--repeats`` times: medians.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import time
from pathlib import Path

import numpy as np
from common import OUT, alternate, machine, make_folder, pack, save, table
from ffcv_like import RESIZE, resize
from PIL import Image

_out = None  # each emulated FFCV worker's own output file


def _open(folder: str) -> None:
    global _out
    _out = open(os.path.join(folder, f"{os.getpid()}.raw"), "wb")


def _encode(job: tuple[str, int]) -> int:
    path, size = job
    image = np.asarray(Image.open(path).convert("RGB"))
    h, w = image.shape[:2]
    scale = size / max(h, w)
    if scale < 1:
        dims = (max(1, round(w * scale)), max(1, round(h * scale)))
        image = resize(image, *dims)
    _out.write(image.tobytes())
    _out.flush()
    return image.nbytes


def ffcv_emulated(files: list[Path], size: int, workers: int, work: Path) -> float:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(workers, _open, (str(work),)) as pool:
        sum(pool.imap_unordered(_encode, [(str(f), size) for f in files], chunksize=16))
    return time.perf_counter() - t0


def ffcv_real(files: list[Path], size: int, workers: int, work: Path) -> float:
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    class Folder:  # what FFCV's examples hand it: (PIL image, label) pairs
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            return Image.open(files[i]).convert("RGB"), 0

    work.mkdir(parents=True, exist_ok=True)
    fields = {"image": RGBImageField(write_mode="raw", max_resolution=size), "label": IntField()}
    t0 = time.perf_counter()
    DatasetWriter(str(work / "ffcv.beton"), fields, num_workers=workers).from_indexed_dataset(
        Folder()
    )
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", help="comma-separated counts (default: 1 and every core)")
    a = p.parse_args()
    src = OUT / f"pack-src-{a.images}"
    if not src.exists():
        make_folder(src, classes=10, per_class=max(1, a.images // 10))
    files = sorted(src.rglob("*.jpg"))
    for f in files:
        f.read_bytes()  # warm
    try:
        import ffcv  # noqa: F401

        ffcv_writer, kind = ffcv_real, "FFCV's DatasetWriter"
    except ImportError:
        ffcv_writer, kind = ffcv_emulated, "FFCV's writer, emulated"
    counts = a.workers.split(",") if a.workers else (1, len(os.sched_getaffinity(0)))
    rows, results = [], {}
    for workers in sorted(set(map(int, counts))):
        options = ("--resize", "fit", "--size", str(a.size), "--workers", str(workers))
        sides = {
            "pack-images": lambda o=options: len(files) / pack(src, OUT / "pack-out.bin", *o),
            kind: lambda w=workers: len(files) / ffcv_writer(files, a.size, w, OUT / "ffcv-out"),
        }
        got = alternate(sides, a.repeats)
        results[f"{workers} workers"] = got
        ours, theirs = got["pack-images"]["median"], got[kind]["median"]
        rows.append([workers, round(ours), round(theirs), f"{ours / theirs:.2f}x"])
    print(machine())
    print(f"FFCV's resize: {RESIZE}")
    print(
        f"{len(files)} JPEGs (about 400x350), longer side to {a.size}, raw, warm page cache, "
        f"medians of {a.repeats}; images/s (pack-images counts starting its process)"
    )
    print(table(["workers", "pack-images", kind, "ratio"], rows))
    save("bench_pack", results)


if __name__ == "__main__":
    main()
