#!/usr/bin/env python3
"""Time to the first batch on a cold pack, against reading its records with ``os.pread``.

    python scripts/bench_first_batch.py --pack /tmp/big.bin --make-gb 1 --size 448 --batch-size 8
    python scripts/bench_first_batch.py --pack /tmp/big.bin --workers inprocess,2 --repeats 3

Each repeat drops the pack's pages, then reads the first batch's records with one
``os.pread`` each (the floor: the bytes the batch needs, nothing else), drops them again,
opens the dataset and times ``next(iter(loader))``. Prints one JSON line per (loader,
repeat): seconds to open, to the first batch (from ``iter()``), its ratio to the preads,
and to the next 20 batches and the end of the epoch. Run it with ``PYTHONPATH`` pointing at
two checkouts to compare them in one sitting.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def make_pack(path: Path, gigabytes: float, size: int = 224) -> None:
    """A pack of about ``gigabytes`` GiB of ``size`` x ``size`` random records."""
    from imgpack.packer.writer import PackWriter

    count = int(gigabytes * 2**30 // (size * size * 3))
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (64, size, size, 3), dtype=np.uint8)
    with PackWriter(path, height=size, width=size, classes=["a", "b"]) as w:
        for i in range(count):
            w.append(base[i % 64], i % 2, f"{'ab'[i % 2]}/{i}.png")
        w.finish(packer={"size": [size, size], "resize": "stretch", "filter": "bilinear"})


def pread_records(pack: Path, records: np.ndarray) -> float:
    """Seconds to read ``records`` of a cold ``pack`` with one ``os.pread`` each."""
    from imgpack.diagnose.measure import drop_cache
    from imgpack.format.index import read_index

    ix = read_index(pack)
    base, size = ix.sections["pixels"].offset, ix.record_bytes
    drop_cache(pack)
    fd = os.open(pack, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        for r in records.tolist():
            if len(os.pread(fd, size, base + r * size)) != size:
                raise OSError(f"{pack}: short read of record {r}")
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def first_batch(pack: Path, workers: int | None, batch_size: int) -> dict:
    from imgpack.diagnose.measure import drop_cache
    from imgpack.reader.dataset import PackedImageDataset
    from imgpack.reader.loader import make_loader

    kw = {} if workers is None else {"num_workers": workers}
    with PackedImageDataset(pack) as probe:  # the same seed gives the same first batch
        first = next(make_loader(probe, batch_size, seed=1).order.batches(0, 0))
    pread_s = pread_records(pack, np.asarray(first))
    drop_cache(pack)
    t0 = time.perf_counter()
    ds = PackedImageDataset(pack)
    loader = make_loader(ds, batch_size, seed=1, **kw)
    t_open = time.perf_counter()
    it = iter(loader)
    next(it)
    t1 = time.perf_counter()
    more = sum(1 for _, _ in zip(range(20), it))
    t2 = time.perf_counter()
    rest = sum(1 for _ in it)
    t3 = time.perf_counter()
    warmer = ds._packs[0].warmer  # the pack's background warm; None when none was started
    warm = None if warmer is None else warmer.state
    loader.close()
    ds.close()
    return {
        "open_s": round(t_open - t0, 4),
        "first_batch_s": round(t1 - t_open, 4),
        "pread_s": round(pread_s, 4),
        "vs_pread": round((t1 - t_open) / pread_s, 2),
        "next_20_s": round(t2 - t1, 3),
        "epoch_s": round(t3 - t0, 3),
        "batches": 1 + more + rest,
        "warm_state_at_end": warm,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pack", type=Path, required=True)
    p.add_argument("--make-gb", type=float, default=None)
    p.add_argument("--workers", default="inprocess,2")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--size", type=int, default=224, help="record side, with --make-gb")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--label", default="")
    a = p.parse_args()
    if a.make_gb is not None:
        make_pack(a.pack, a.make_gb, a.size)
    for w in a.workers.split(","):
        workers = None if w == "inprocess" else int(w)
        for r in range(a.repeats):
            row = {
                "label": a.label,
                "loader": w,
                "repeat": r,
                **first_batch(a.pack, workers, a.batch_size),
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
