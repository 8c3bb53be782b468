#!/usr/bin/env python3
"""Fidelity of train/eval crops per storage rule (FFCV's, stretch, fit raw, fit yuv420), and the
speed of DeviceTransform.train/eval.

    python scripts/bench_augment.py --out augment.json    # the full run (10-20 minutes)
    python scripts/bench_augment.py --fidelity-only       # the PSNR tables only
    python scripts/bench_augment.py --quick               # seconds, to try it

Prints markdown tables (one per photo set), the verdict against FFCV's rule with the same
filter, and writes the JSON; the logic is in scripts/workbench/bench_augment*.py and
bench_storage.py. docs/bench_v3.md has a full run.
"""

from __future__ import annotations

from pathlib import Path

import click
from workbench.bench_augment_report import report
from workbench.bench_augment_run import run_augment_bench
from workbench.cli import bench_command
from workbench.report import run_reported


def _log(msg: str) -> None:
    click.echo(msg, err=True)


@bench_command(
    quick="A few small images and settings: seconds.",
    work="Keep the photos and packs here (default: a temporary folder).",
)
@click.option("--fidelity-only", is_flag=True, help="Skip the resampler and speed timings.")
def main(quick: bool, out: Path | None, work: Path | None, seed: int, fidelity_only: bool) -> None:
    kw = {"quick": quick, "seed": seed, "timings": not fidelity_only, "log": _log}
    run_reported("bench_augment", run_augment_bench, report, work, out, **kw)


if __name__ == "__main__":
    main()
