#!/usr/bin/env python3
"""Loading: the default loader beside the ``numpy.memmap`` loops it replaces, and a cold first
batch beside the reads it needs.

    python scripts/bench_load.py                       # 3,000 records of 224x224, batch 256
    python scripts/bench_load.py --images 200 --size 32 --batch-size 16 --repeats 1   # a try

The obvious alternative to imgpack's reader is thirty lines: ``numpy.memmap`` the records,
sort each batch's indices (file order), gather, ``torch.from_numpy``. Two such loops run here:
``mm[idx]`` (a fresh array per batch) and the careful one, ``np.take(mm, idx, axis=0,
out=buf, mode="clip")`` into one reused buffer (``mode="clip"`` lets numpy write straight into
``buf``; its default buffers the output, one copy more). A consumer that only counted batches
would flatter any loader whose batches are views, so the consumer copies each batch into a
tensor of its own, as a host-to-device copy reads every byte; "reads nothing" is what a GPU's
DMA costs the CPU. The sides alternate, one epoch each, ``--repeats`` times: medians.

The cold first batch: the pack's pages dropped (``posix_fadvise``), a fresh dataset and
loader, the time to the first batch beside one ``os.pread`` of the same records.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import time

import numpy as np
import torch
from common import OUT, alternate, machine, make_folder, pack, save, table

from imgpack import PackedImageDataset, make_loader


def memmap_loop(path, batch_size: int, careful: bool, seed: int = 0):
    """One shuffled epoch per call of the loop a user would write without imgpack."""
    with open(path.with_suffix(".json"), encoding="utf-8") as f:
        ix = json.load(f)
    shape = (ix["count"], *ix["shape"])
    mm = np.memmap(path, dtype=np.uint8, mode="r", offset=ix["data_offset"], shape=shape)
    with PackedImageDataset(path) as ds:
        labels = np.asarray(ds.targets, dtype=np.int64)
    rng = np.random.default_rng(seed)
    buf = np.empty((batch_size, *shape[1:]), dtype=np.uint8)

    def epoch():
        order = rng.permutation(len(mm))
        for start in range(0, len(mm), batch_size):
            idx = np.sort(order[start : start + batch_size])
            if careful:
                images = np.take(mm, idx, axis=0, out=buf[: len(idx)], mode="clip")
            else:
                images = mm[idx]
            yield torch.from_numpy(images).permute(0, 3, 1, 2), torch.from_numpy(labels[idx])

    return epoch


def rate(epoch, consume) -> float:
    n, t0 = 0, time.perf_counter()
    for images, labels in epoch():
        if consume is not None:
            consume(images)
        n += len(labels)
    return n / (time.perf_counter() - t0)


def first_batch(path, batch_size: int) -> tuple[float, float]:
    """(seconds to the first batch of a cold pack, seconds to pread its records cold)."""

    def drop() -> None:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

    drop()
    t0 = time.perf_counter()
    with PackedImageDataset(path) as ds:
        loader = make_loader(ds, batch_size, shuffle=False)
        images, _ = next(iter(loader))
        took = time.perf_counter() - t0
        loader.close()
    with open(path.with_suffix(".json"), encoding="utf-8") as f:
        offset = json.load(f)["data_offset"]  # records are stored back to back from here
    nbytes = images[0].numel() * batch_size
    drop()
    fd = os.open(path, os.O_RDONLY)
    t0 = time.perf_counter()
    os.pread(fd, nbytes, offset)
    read = time.perf_counter() - t0
    os.close(fd)
    return took, read


def versus(path, batch_size: int, repeats: int) -> tuple[dict, list, str]:
    """The loader and the two loops, alternated, for each consumer: results, rows, and the
    first line of ``print(loader)``."""
    kept: dict = {}

    def reused(images: torch.Tensor) -> None:
        # numpy's copy keeps the batch's memory order (torch's copy_ of a permuted uint8
        # batch runs element by element and would time itself, not the loaders)
        arr = images.numpy()
        key = (arr.shape, arr.strides)
        if key not in kept:
            kept[key] = np.empty_like(arr)
        np.copyto(kept[key], arr)

    consumers = {"copies into a reused tensor": reused, "reads nothing (a GPU's DMA)": None}
    results, rows = {}, []
    with PackedImageDataset(path) as ds:
        loader = make_loader(ds, batch_size)
        sides = {
            "mm[idx]": memmap_loop(path, batch_size, careful=False),
            "np.take(out=, clip)": memmap_loop(path, batch_size, careful=True),
            "make_loader": lambda: loader,
        }
        for name, consume in consumers.items():
            runs = {k: functools.partial(rate, e, consume) for k, e in sides.items()}
            results[name] = got = alternate(runs, repeats)
            m = [v["median"] for v in got.values()]
            rows.append([name, *map(round, m), f"{m[2] / m[1]:.2f}x"])
        printed = str(loader).splitlines()[0]
        loader.close()
    return results, rows, printed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=3000)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    work = OUT / f"load-{a.images}-{a.size}"
    path = work / "p.bin"
    if not path.exists():
        make_folder(work / "src", classes=10, per_class=a.images // 10)
        pack(work / "src", path, "--size", str(a.size))
    results, rows, printed = versus(path, a.batch_size, a.repeats)
    print(machine())
    print(
        f"{a.images} records of {a.size}x{a.size}x3, batch {a.batch_size}, warm page cache, "
        f"medians of {a.repeats} epochs each; {printed}"
    )
    header = ["consumer", "`mm[idx]`", "`np.take(out=, clip)`", "`make_loader`", "vs careful"]
    print(table(header, rows))
    gc.collect()  # a page still mapped cannot be dropped from the cache
    cold = [first_batch(path, a.batch_size) for _ in range(a.repeats)]
    took, read = (float(np.median(v)) for v in zip(*cold))
    print(
        table(
            ["cold pack", "first batch, s", "pread of its records, s", "ratio"],
            [[f"batch {a.batch_size}", f"{took:.4f}", f"{read:.4f}", f"{took / read:.2f}x"]],
        )
    )
    results["first_batch"] = {"seconds": took, "pread_s": read}
    save("bench_load", results)


if __name__ == "__main__":
    main()
