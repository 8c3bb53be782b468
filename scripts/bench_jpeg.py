#!/usr/bin/env python3
"""JPEG records (issue 20, item 7), one run, side by side on the same photographs and records:

  (a) bytes/image and PSNR against the original for quality 75/90/95 at longer sides
      256/384/512 beside FFCV's raw rule, 4:4:4 at one setting, and the scale-aware decode;
  (b) decode images/s per core and from 1 to 2 threads: imgpack against a plain simplejpeg
      loop and Pillow's decoder;
  (c) images/s delivered ready for the device transform against FFCV's JPEG pipeline.

    python scripts/bench_jpeg.py --out jpeg.json    # the full run (2-3 minutes on 2 cores)
    python scripts/bench_jpeg.py --quick            # seconds, to try it

Prints markdown tables and the verdicts against the issue's targets, and writes the JSON;
the logic is in scripts/workbench/bench_jpeg*.py and jpeg_decoders.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from workbench.bench_jpeg_report import report
from workbench.bench_jpeg_run import run_jpeg_bench
from workbench.cli import bench_command
from workbench.report import run_reported


def _log(msg: str) -> None:
    click.echo(msg, err=True)


@bench_command(
    quick="A few small images and settings: seconds.",
    work="Keep the photos and packs here (default: a temporary folder); "
    "its photos/ is made anew each run.",
)
@click.option("--fidelity-only", is_flag=True, help="Table (a) only: no timings.")
@click.option("--speed-only", is_flag=True, help="Tables (b) and (c) only.")
def main(quick: bool, out: Path | None, work: Path | None, seed: int, fidelity_only: bool,
         speed_only: bool) -> None:  # fmt: skip
    if fidelity_only and speed_only:
        click.echo("bench_jpeg: --fidelity-only and --speed-only exclude each other", err=True)
        sys.exit(2)
    kw = {"quick": quick, "seed": seed, "fidelity": not speed_only, "speed": not fidelity_only,
          "log": _log}  # fmt: skip
    run_reported("bench_jpeg", run_jpeg_bench, report, work, out, **kw)


if __name__ == "__main__":
    main()
