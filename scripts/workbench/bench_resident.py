"""Streamed against resident, on the CPU: what holding a pack in (device) memory costs a batch.

The same pack, the same seed, the same consumer (each batch copied into a tensor it keeps,
as a training step's device copy reads every byte), two loaders alternated:

``streamed``  ``make_loader(ds, B, device="cpu")``: each batch read from the mapped pack.
``resident``  ``make_loader(ds, B, device="cpu", resident=True)``: the pack copied once into
              process memory, each batch gathered from that copy (what a GPU does from its
              own memory, here on the CPU, so the resident path's cost is the gather alone).

Packs: CIFAR-sized raw records (32x32), 64x64 raw, and ``fit`` yuv420 records of sample
photographs (records of many sizes, delivered as their RGB canvas). The first pass of the
resident loader, which copies the pack, is timed apart.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from imgpack.packer.pack import pack_folder
from imgpack.packer.writer import PackWriter
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from workbench.sample import make_sample_folder
from workbench.versus import Consumer

__all__ = ["FULL", "QUICK", "run_resident_bench", "report"]

# name -> (kind, side or size, records)
FULL = {"32x32 raw": ("raw", 32, 50_000), "64x64 raw": ("raw", 64, 20_000),
        "fit 160 yuv420": ("fit", 160, 2_000)}  # fmt: skip
QUICK = {"32x32 raw": ("raw", 32, 600), "fit 64 yuv420": ("fit", 64, 40)}


def _raw_pack(out: Path, side: int, count: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (64, side, side, 3), dtype=np.uint8)
    with PackWriter(out, height=side, width=side, classes=["a", "b"]) as w:
        for i in range(count):
            w.append(base[i % 64], i % 2, f"{'ab'[i % 2]}/{i}.png")
        w.finish(packer={"size": [side, side], "resize": "stretch", "filter": "bilinear"})
    return out


def _fit_pack(work: Path, side: int, count: int, seed: int) -> Path:
    src = make_sample_folder(work / f"photos{count}", classes=10, per_class=count // 10, seed=seed)
    out = work / f"fit{side}.bin"
    pack_folder(src, out, size=(side, side), resize="fit", codec="yuv420", progress=False,
                force=True)  # fmt: skip
    return out


def _canvas(images: Any, records: Any) -> Any:
    return images  # records of many sizes travel as their padded canvas


def _epoch(loader: Any, consume: Consumer) -> float:
    n, t0 = 0, time.perf_counter()
    for images, labels, *_ in loader:
        consume(images)
        n += len(labels)
    return n / (time.perf_counter() - t0)


def _one_pack(path: Path, batch: int, epochs: int, alternations: int, seed: int) -> dict:
    ds = PackedImageDataset(path)
    kw: dict[str, Any] = {"transform": _canvas} if ds.codec == "yuv420" else {}
    loaders = {
        "streamed": make_loader(ds, batch, seed=seed, device="cpu", **kw),
        "resident": make_loader(ds, batch, seed=seed, device="cpu", resident=True, **kw),
    }
    consume = Consumer("reused")
    t0 = time.perf_counter()
    next(iter(loaders["resident"]))  # the copy to the device
    copy_s = time.perf_counter() - t0
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for loader in loaders.values():
        _epoch(loader, consume)  # untimed: page tables, buffers
    for _ in range(alternations):
        for name, loader in loaders.items():
            rates[name] += [_epoch(loader, consume) for _ in range(epochs)]
    held = loaders["resident"].resident_bytes
    for loader in loaders.values():
        loader.close()
    medians = {name: statistics.median(v) for name, v in rates.items()}
    return {"records": len(ds), "codec": ds.codec, "shape": list(ds.shape),
            "resident_bytes": held, "copy_s": copy_s, "batch": batch,
            "streamed": medians["streamed"], "resident": medians["resident"],
            "ratio": medians["resident"] / medians["streamed"], "samples": rates}  # fmt: skip


def run_resident_bench(work: str, *, quick: bool = False, seed: int = 0, batch: int = 256,
                       epochs: int = 3, alternations: int = 3,
                       log: Callable[[str], None] = print) -> dict:  # fmt: skip
    """Each pack of ``FULL`` (``QUICK``) made in ``work``, then streamed and resident."""
    work_dir = Path(work)
    rows = {}
    for name, (kind, side, count) in (QUICK if quick else FULL).items():
        log(f"{name}: {count} records")
        if kind == "raw":
            path = _raw_pack(work_dir / f"raw{side}.bin", side, count, seed)
        else:
            path = _fit_pack(work_dir, side, count, seed)
        rows[name] = _one_pack(path, 32 if quick else batch, 1 if quick else epochs,
                               1 if quick else alternations, seed)  # fmt: skip
    return {"packs": rows}


def report(result: dict) -> str:
    """The markdown table for docs/benchmarks.md."""
    lines = [
        "| pack | records | held | first pass: copy, s | streamed, images/s | "
        "resident, images/s | resident / streamed |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in result["packs"].items():
        lines.append(
            f"| {name} | {r['records']:,} | {r['resident_bytes'] / 2**20:,.0f} MiB | "
            f"{r['copy_s']:.2f} | {r['streamed']:,.0f} | {r['resident']:,.0f} | "
            f"{r['ratio']:.2f}x |"
        )
    return "\n".join(lines)
