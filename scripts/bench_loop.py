#!/usr/bin/env python3
"""The usual training loop's speed, for two checkouts side by side in one run.

    python scripts/bench_loop.py --tree before=/tmp/old --tree after=. --images 4000

Writes one pack (224x224 by default) and, for each checkout in turn (alternating, so that
both see the same machine), times full warm epochs of ``for x, y in loader`` with
``make_loader(ds, B)``, and of a plain ``torch.utils.data.DataLoader`` with the default
collate (the per-sample path), in a fresh process with that checkout on ``PYTHONPATH``.
Prints one JSON line per measurement and a markdown table: median images/s over every timed
epoch of every round, and the best epoch (on a busy machine the best is the steadier figure).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = {
    "make_loader(ds, B)": "make_loader",
    "make_loader(ds, B, num_workers=2)": "workers2",
    "DataLoader(ds, B, shuffle=True), default collate, 0 workers": "dl0",
    "DataLoader(ds, B, shuffle=True), default collate, 2 workers": "dl2",
}


def make_pack(path: Path, count: int, size: int) -> None:
    import numpy as np

    from imgpack.packer.writer import PackWriter

    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (32, size, size, 3), dtype=np.uint8)
    with PackWriter(path, height=size, width=size, classes=["a", "b"]) as w:
        for i in range(count):
            w.append(base[i % 32], i % 2, f"{'ab'[i % 2]}/{i}.png")
        w.finish(packer={"size": [size, size], "resize": "stretch", "filter": "bilinear"})


def child(pack: str, case: str, batch: int, epochs: int) -> None:
    """Runs inside the checkout under test: warm-up epoch, then ``epochs`` timed ones."""
    import torch
    from torch.utils.data import DataLoader

    from imgpack.reader.dataset import PackedImageDataset
    from imgpack.reader.loader import make_loader

    ds = PackedImageDataset(pack)
    if case == "make_loader":
        loader = make_loader(ds, batch, seed=0)
    elif case == "workers2":
        loader = make_loader(ds, batch, seed=0, num_workers=2)
    else:
        workers = int(case[2:])
        kw = {"persistent_workers": True} if workers else {}
        loader = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, **kw)
    rates = []
    try:
        for e in range(epochs + 1):
            t, n = time.perf_counter(), 0
            for x, _y in loader:
                n += len(x)
            if e:
                rates.append(n / (time.perf_counter() - t))
    except Exception as exc:  # the old checkout's contract bug: report it as the result
        print(json.dumps({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}))
        return
    del torch
    print(json.dumps({"rates": rates}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", action="append", required=True, help="NAME=PATH of a checkout")
    p.add_argument("--images", type=int, default=4000)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2, help="alternations of the checkouts")
    p.add_argument("--pack", type=Path, default=Path("/tmp/bench_loop/pack.bin"))
    p.add_argument("--case", action="append", choices=sorted(CASES.values()),
                   help="time only this case (repeat for more; default: every case)")  # fmt: skip
    p.add_argument("--child", nargs=2, metavar=("PACK", "CASE"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a.child[0], a.child[1], a.batch_size, a.epochs)
    trees = dict(t.split("=", 1) for t in a.tree)
    cases = {label: case for label, case in CASES.items() if not a.case or case in a.case}
    if not a.pack.exists():
        a.pack.parent.mkdir(parents=True, exist_ok=True)
        make_pack(a.pack, a.images, a.size)
    results: dict[tuple[str, str], list[float]] = {}
    errors: dict[tuple[str, str], str] = {}
    for r in range(a.rounds):
        for label, case in cases.items():
            for name, tree in trees.items():
                env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
                cmd = [sys.executable, __file__, "--tree", "x=.", "--child", str(a.pack), case]
                cmd += ["--batch-size", str(a.batch_size), "--epochs", str(a.epochs)]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
                line = (out.stdout.strip().splitlines() or ['{"error": "no output"}'])[-1]
                row = json.loads(line)
                print(json.dumps({"round": r, "tree": name, "case": label, **row}), flush=True)
                if "rates" in row:
                    results.setdefault((label, name), []).extend(row["rates"])
                else:
                    errors[(label, name)] = row["error"]
    print(f"\n| loop ({a.images} records {a.size}x{a.size}, batch {a.batch_size}, warm) | "
          + " | ".join(trees) + " |")  # fmt: skip
    print("|---|" + "---:|" * len(trees))
    for label in cases:
        cells = []
        for name in trees:
            rates = results.get((label, name))
            cells.append(
                f"{statistics.median(rates):,.0f} (best {max(rates):,.0f})" if rates
                else f"fails: {errors.get((label, name), '?')[:60]}"
            )  # fmt: skip
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
