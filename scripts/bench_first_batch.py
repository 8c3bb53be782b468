#!/usr/bin/env python3
"""Time to the first batch on a cold pack: drop its pages, open it, time ``next(iter(loader))``.

    python scripts/bench_first_batch.py --pack /tmp/big.bin --make-gb 2   # writes the pack once
    python scripts/bench_first_batch.py --pack /tmp/big.bin --workers 0,2 --repeats 3

Run it with ``PYTHONPATH`` pointing at two checkouts to compare them in one sitting.
Prints one JSON line per (loader, repeat): seconds to the first batch, to the next 20, and
to the end of the first epoch (from opening the dataset).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def make_pack(path: Path, gigabytes: float, size: int = 224) -> None:
    from imgpack.packer.writer import PackWriter

    count = int(gigabytes * 2**30 // (size * size * 3))
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (64, size, size, 3), dtype=np.uint8)
    with PackWriter(path, height=size, width=size, classes=["a", "b"]) as w:
        for i in range(count):
            w.append(base[i % 64], i % 2, f"{'ab'[i % 2]}/{i}.png")
        w.finish(packer={"size": [size, size], "resize": "stretch", "filter": "bilinear"})


def first_batch(pack: Path, workers: int | None, batch_size: int) -> dict:
    from imgpack.diagnose.measure import drop_cache
    from imgpack.reader.dataset import PackedImageDataset
    from imgpack.reader.loader import make_loader

    drop_cache(pack)
    t0 = time.perf_counter()
    ds = PackedImageDataset(pack)
    kw = {} if workers is None else {"num_workers": workers}
    loader = make_loader(ds, batch_size, seed=1, **kw)
    it = iter(loader)
    next(it)
    t1 = time.perf_counter()
    for _ in range(20):
        next(it)
    t2 = time.perf_counter()
    rest = sum(1 for _ in it)
    t3 = time.perf_counter()
    warmer = ds._packs[0].warmer  # the pack's background warm; None when none was started
    warm = None if warmer is None else warmer.state
    loader.close()
    ds.close()
    return {
        "first_batch_s": round(t1 - t0, 3),
        "next_20_s": round(t2 - t1, 3),
        "epoch_s": round(t3 - t0, 3),
        "batches": 21 + rest,
        "warm_state_at_end": warm,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pack", type=Path, required=True)
    p.add_argument("--make-gb", type=float, default=None)
    p.add_argument("--workers", default="inprocess,2")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--label", default="")
    a = p.parse_args()
    if a.make_gb is not None:
        make_pack(a.pack, a.make_gb)
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
