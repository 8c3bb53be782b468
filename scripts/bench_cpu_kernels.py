#!/usr/bin/env python3
"""The CPU kernels (issue 28), one run, side by side on the same photographs:

  (a) yuv420 records to RGB (``imgpack.format.codec.yuv420_to_rgb``) beside copying raw
      records of the same photographs, on 1 and 2 threads;
  (b) per-record crop resamplers: imgpack's (``imgpack.reader.cpuresample``), torch's
      antialiased interpolate (box rounded, or aligned), FFCV's OpenCV resize: us per
      crop and dB lost against the exact resample;
  (c) decode + crop + resize + flip into a batch against FFCV's CPU pipeline;
  (d) the per-batch normalise into a float tensor.

    python scripts/bench_cpu_kernels.py --out cpu.json    # the full run (minutes on 2 cores)
    python scripts/bench_cpu_kernels.py --quick           # seconds, to try it

Prints markdown tables and writes the JSON; the logic is in scripts/workbench/cpu_*.py.
"""

from __future__ import annotations

from pathlib import Path

import click
from workbench.cli import bench_command
from workbench.cpu_kernels import run_cpu_kernels
from workbench.cpu_kernels_report import report
from workbench.report import run_reported


def _log(msg: str) -> None:
    click.echo(msg, err=True)


@bench_command(
    quick="A few small photographs and crops: seconds.",
    work="Keep the photos and packs here (default: a temporary folder); "
    "its photos/ is made anew each run.",
)
def main(quick: bool, out: Path | None, work: Path | None, seed: int) -> None:
    run_reported("bench_cpu_kernels", run_cpu_kernels, report, work, out,
                 quick=quick, seed=seed, log=_log)  # fmt: skip


if __name__ == "__main__":
    main()
