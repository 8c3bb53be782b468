#!/usr/bin/env python3
"""Train's input from a JPEG pack ten times larger than the memory the process may use.

    python scripts/bench_beyond_ram.py --work /tmp/beyond --gb 10 --memory-mb 1024

Packs real photographs as jpeg q90 (fit 384), writes a pack of ``--gb`` GiB of their
records, then runs the same loop (``make_loader`` + ``DeviceTransform.train`` to 224, batch
256, shuffled) three times in a child process: over the small pack warm in the page cache
(the reference), and over the big pack cold, without and with a memory cgroup of
``--memory-mb`` (cgroup v1, needs root; without one that case is left out and said so).
Prints one JSON line per case and the ratio of each to the reference. Needs --gb of disk.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workbench.beyond_ram import make_packs, memory_cgroup, run_case  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--work", type=Path, help="Keep the photos and packs here (default: a temp folder)."
    )
    ap.add_argument("--gb", type=float, default=10.0, help="Size of the big pack in GiB.")
    ap.add_argument("--memory-mb", type=int, default=1024, help="The child's memory cgroup limit.")
    ap.add_argument("--batches", type=int, default=60, help="Batches per case.")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--photos", type=int, default=200)
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="imgpack-beyond-"))
    work.mkdir(parents=True, exist_ok=True)
    small, big = make_packs(work, args.gb, args.photos)
    cgroup = memory_cgroup(args.memory_mb)
    cases = [(small, None, False), (big, None, True)]
    if cgroup is None:
        print(json.dumps({"note": "no memory cgroup could be made (cgroup v1 as root needed)"}))
    else:
        cases.append((big, cgroup, True))
    rows = []
    try:
        for pack, group, cold in cases:
            row = run_case(pack, args.batches, args.batch_size, group, cold)
            row["memory_limit_mb"] = args.memory_mb if group else None
            rows.append(row)
            row["vs_warm_small"] = row["images_per_s"] / rows[0]["images_per_s"]
            print(json.dumps(row), flush=True)
    finally:
        if cgroup is not None:
            shutil.rmtree(cgroup[0], ignore_errors=True)  # rmdir of an empty cgroup
            try:
                cgroup[0].rmdir()
            except OSError:
                pass
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
