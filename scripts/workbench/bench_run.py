"""The whole benchmark of issue 3 item 8 in one run: what ``scripts/bench_load.py`` calls.

Rows, each the median of ``repeats`` after a warm-up:
  memcpy       one thread copying a warm buffer: the physical limit, as records/s
  fromfile     np.fromfile of the whole .bin, warm and cold: what the disk/cache gives
  baseline     per-file PIL decode + resize through the usual DataLoader template,
               on a bounded number of batches (it is slow)
  imgpack      make_loader over full epochs: the default, then num_workers x
               prefetch_factor and the in-process path; warm, then cold (pages
               dropped first) with uniform vs block order, with and without hints.

The JPEG folder is small (the baseline never gets through much of it); the pack
for the imgpack rows is large, made by repeating the records packed from that
folder, because a raw-pixel reader's speed depends on bytes, not on content.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.diagnose.advise import Config, sweep_configs
from imgpack.diagnose.measure import (
    cached_fraction,
    close_loader,
    cycle_batches,
    drop_cache,
    stat,
    time_window,
)
from workbench.bench import fromfile_images_per_s, memcpy_images_per_s, time_epoch
from workbench.report import add_ratios, machine_info

__all__ = ["tile_pack", "sample_folder", "prepare", "run_benchmark"]

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def tile_pack(small_bin: str | os.PathLike, out_bin: str | os.PathLike, count: int) -> Path:
    """Write a pack of ``count`` records by repeating those of ``small_bin`` in order."""
    from imgpack.format.index import read_index
    from imgpack.packer.digest import digest_record
    from imgpack.packer.writer import PackWriter

    ix = read_index(small_bin)
    raw = np.memmap(ix.data_path, dtype=np.uint8, mode="r")
    pixels = ix.section_array("pixels", raw).reshape(ix.count, *ix.shape)
    labels = ix.read_section("labels")
    offsets, paths = ix.read_section("path_offsets"), ix.read_section("paths")
    digests = [digest_record(pixels[i]) for i in range(ix.count)]  # same bytes, same digest
    with PackWriter(out_bin, height=ix.height, width=ix.width, classes=list(ix.classes)) as w:
        for k in range(count):
            i = k % ix.count
            rel = ix.source_path(i, offsets, paths)
            w.append(pixels[i], int(labels[i]), f"{rel}#{k // ix.count}", digest=digests[i])
        w.finish(packer={**ix.raw["packer"], "tiled_from": ix.data_path.name})
    del pixels, raw
    return Path(out_bin)


def sample_folder(
    work_dir: str | os.PathLike,
    *,
    sample_images: int,
    src: str | os.PathLike | None = None,
    log: Log = _stderr,
) -> Path:
    """The JPEG folder of the run: ``src``, or ``sample_images`` made under ``work_dir`` once."""
    from workbench.sample import make_sample_folder

    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    if src is None:
        classes = 10
        src = work / f"sample-{sample_images}"
        done = work / f"sample-{sample_images}.done"
        if not done.exists():
            log(f"making {sample_images} sample JPEGs in {src}")
            make_sample_folder(src, classes=classes, per_class=max(1, sample_images // classes))
            done.touch()
    return Path(src)


def prepare(
    work_dir: str | os.PathLike,
    *,
    images: int,
    size: int,
    sample_images: int,
    src: str | os.PathLike | None = None,
    pack: str | os.PathLike | None = None,
    log: Log = _stderr,
) -> tuple[Path, Path]:
    """(JPEG folder, pack) for the run; made under ``work_dir`` once and reused after."""
    from imgpack.format.index import read_index
    from imgpack.packer.pack import pack_folder

    work = Path(work_dir)
    src = sample_folder(work, sample_images=sample_images, src=src, log=log)
    if pack is None:
        small = work / f"{src.name}-{size}.bin"
        if not small.with_suffix(".json").exists():
            log(f"packing {src} at {size}x{size}")
            pack_folder(src, small, size=(size, size), force=True, progress=None)
        pack = work / f"bench-{size}-{images}.bin"
        if not pack.with_suffix(".json").exists() or read_index(pack).count != images:
            log(f"writing a {images}-image pack ({images * size * size * 3 / 1e9:.2f} GB)")
            tile_pack(small, pack, images)
    return src, Path(pack)


def _row(row: str, label: str, cache: str, samples: Sequence[float], **extra: Any) -> dict:
    return {"row": row, "label": label, "cache": cache, **stat(samples).to_json(), **extra}


def _baseline(src: Path, *, size: int, batch_size: int, batches: int, repeats: int) -> dict:
    from workbench.baseline import PerFileImageDataset, baseline_loader

    loader = baseline_loader(PerFileImageDataset(src, size=size), batch_size)
    it = cycle_batches(loader)
    try:
        next(it)  # warm-up: workers start, first files read
        rates = []
        for _ in range(repeats):
            n, s, _ = time_window(it, batches)
            rates.append(n / s)
    finally:
        it.close()
        close_loader(loader)
    workers = getattr(loader, "num_workers", None)
    label = f"baseline: per-file PIL decode+resize, DataLoader template, num_workers={workers}"
    return _row("baseline", label, "warm", rates, batches=batches, num_workers=workers)


def _imgpack(
    pack: Path,
    label: str,
    *,
    batch_size: int,
    repeats: int,
    cold: bool,
    config: Config | None,
    order: str = "uniform",
    advice: str | None = None,
    prefault: bool | None = None,
    hints: bool | None = None,
) -> dict:
    """Median images/s over full epochs; warm after one untimed epoch, or cold each time."""
    from imgpack.reader.dataset import PackedImageDataset
    from imgpack.reader.loader import make_loader

    kw = {} if config is None else config.kwargs()
    if hints is not None and (config is None or config.mode == "inprocess"):
        from imgpack.reader.options import InProcessOptions

        base = kw.get("options") or InProcessOptions()
        kw["options"] = dataclasses.replace(base, hints=hints)

    def new():
        ds = PackedImageDataset(pack, advice=advice, prefault=prefault)
        return ds, make_loader(ds, batch_size, seed=0, order=order, **kw)

    rates, cached = [], []
    if not cold:
        ds, loader = new()
        try:
            time_epoch(loader)  # warm-up: workers start, pages mapped (and cached)
            for _ in range(repeats):
                n, s = time_epoch(loader)
                rates.append(n / s)
        finally:
            close_loader(loader, ds)
    else:
        for _ in range(repeats):
            ds, loader = new()
            try:
                drop_cache(pack)
                cached.append(cached_fraction(pack))
                n, s = time_epoch(loader)  # includes starting workers: part of a cold start
                rates.append(n / s)
            finally:
                close_loader(loader, ds)
    return _row(
        "imgpack",
        label,
        "cold" if cold else "warm",
        rates,
        mode=loader.mode,
        config=None if config is None else config.call(batch_size, order),
        num_workers=None if config is None else config.num_workers,
        prefetch_factor=None if config is None else config.prefetch_factor,
        heat_row=None if config is None else config.row,
        order=order,
        advice=advice,
        prefault=prefault,
        hints=hints,
        **({"cached_before": cached} if cold else {}),
    )


def _cold_cases(
    workers: Sequence[int], prefetch: Sequence[int], grid: Sequence[Config]
) -> list[tuple[str, bool, dict[str, Any]]]:
    """Cold rows: the default, then uniform vs block order with and without hints.

    All but the default turn prefault off, so that they show the access pattern
    itself, as on a pack too large to prefault.
    """
    cases = [("imgpack default (prefault auto)", True, {"config": None})]
    inproc = Config("inprocess", 0, None, False)
    busy = [w for w in workers if w > 0]
    wk = Config("workers", max(busy), 4 if 4 in prefetch else max(prefetch)) if busy else None
    for order in ("uniform", "block"):
        hint = "random" if order == "uniform" else "sequential"
        base = {"order": order, "prefault": False}
        cases.append((f"imgpack in-process, {order}, no hints", True,
                      {**base, "config": inproc, "hints": False}))  # fmt: skip
        cases.append((f"imgpack in-process, {order}, madvise {hint} + will-need", True,
                      {**base, "config": inproc, "advice": hint}))  # fmt: skip
        if wk is not None:
            cases.append((f"imgpack {wk.label}, {order}", True, {**base, "config": wk}))
    cases += [(f"imgpack {c.label}, uniform", True, {"config": c, "prefault": False}) for c in grid]
    return cases


def run_benchmark(
    *,
    work_dir: str | os.PathLike = "out/bench",
    images: int = 12_000,
    size: int = 224,
    batch_size: int = 256,
    repeats: int = 3,
    sample_images: int = 1000,
    baseline_batches: int = 4,
    workers: Sequence[int] = (0, 1, 2, 4),
    prefetch: Sequence[int] = (2, 4, 8),
    memcpy_mb: int = 512,
    cold: bool = True,
    cold_grid: bool = False,
    src: str | os.PathLike | None = None,
    pack: str | os.PathLike | None = None,
    log: Log = _stderr,
    emit: Callable[[dict], None] | None = None,
) -> list[dict[str, Any]]:
    """Measure every row; return them (first a ``meta`` row) with ratios filled in.

    ``emit`` gets each row as soon as it is measured (for a live JSON-lines file).
    """
    import torch

    from imgpack.format.index import read_index

    src, pack = prepare(
        work_dir, images=images, size=size, sample_images=sample_images, src=src, pack=pack, log=log
    )
    ix = read_index(pack)
    rb = ix.record_bytes
    meta = {
        "row": "meta",
        **machine_info(),
        "pack": str(pack),
        "pack_bytes": ix.data_file_bytes,
        "images": ix.count,
        "shape": list(ix.shape),
        "record_bytes": rb,
        "batch_size": batch_size,
        "repeats": repeats,
        "src": str(src),
    }
    rows = [meta]

    def add(row: dict) -> None:
        rows.append(row)
        extra = f" (cached before: {row['cached_before']})" if row.get("cached_before") else ""
        log(f"{row['cache']:>4}  {row['label']}: {row['images_per_s']:,.0f} images/s{extra}")
        if emit is not None:
            emit(row)

    if emit is not None:
        emit(meta)
    mc = memcpy_images_per_s(rb, nbytes=memcpy_mb << 20, repeats=repeats)
    add(_row("memcpy", f"memcpy, 1 thread, {memcpy_mb} MB warm buffer", "warm", mc.samples))
    for is_cold in (False, True) if cold else (False,):
        st, cached = fromfile_images_per_s(pack, rb, cold=is_cold, repeats=repeats)
        extra = {"cached_before": [cached]} if is_cold else {}
        cache = "cold" if is_cold else "warm"
        add(_row("fromfile", "np.fromfile of the whole .bin", cache, st.samples, **extra))
    add(_baseline(src, size=size, batch_size=batch_size, batches=baseline_batches, repeats=repeats))

    grid = sweep_configs(cuda=torch.cuda.is_available(), workers=workers, prefetch=prefetch)
    cases = [(f"imgpack default: make_loader(ds, {batch_size})", False, {"config": None})]
    cases += [(f"imgpack {c.label}", False, {"config": c}) for c in grid]
    if cold:
        cases += _cold_cases(workers, prefetch, grid if cold_grid else [])
    for label, is_cold, kw in cases:
        add(_imgpack(pack, label, batch_size=batch_size, repeats=repeats, cold=is_cold, **kw))
    add_ratios(rows)
    return rows
