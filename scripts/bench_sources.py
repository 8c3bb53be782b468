#!/usr/bin/env python3
"""Packing tar shards and Parquet files against the same images as a folder, side by side.

    python scripts/bench_sources.py --out sources.json      # the full run, on a quiet machine
    python scripts/bench_sources.py --quick                 # seconds, to try it

Prints a markdown table for docs/benchmarks.md (progress on stderr); the logic is in
scripts/workbench/bench_sources*.py.
"""

from __future__ import annotations

from pathlib import Path

import click
from workbench.bench_sources import run_sources_bench
from workbench.bench_sources_report import report
from workbench.cli import bench_command
from workbench.report import run_reported


def _log(msg: str) -> None:
    click.echo(msg, err=True)


@bench_command(
    quick="40 small images, 2 repeats: seconds.",
    work="Write the sources and packs here (default: a temporary folder).",
)
@click.option("--images", type=click.IntRange(min=10), default=1000, show_default=True,
              help="ImageNet-like JPEGs (~400x350), in 10 classes.")  # fmt: skip
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Packs of each kind; the order rotates every repeat.")  # fmt: skip
@click.option("--shards", type=click.IntRange(min=1), default=8, show_default=True,
              help="Tar shards, and Parquet files, the images are split into.")  # fmt: skip
@click.option("--size", type=click.IntRange(min=1, max=4096), default=224, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Decoding processes.  [default: all cores]")  # fmt: skip
def main(quick: bool, out: Path | None, work: Path | None, seed: int, images: int,
         repeats: int, shards: int, size: int, workers: int | None) -> None:  # fmt: skip
    kw = {"quick": quick, "seed": seed, "images": images, "repeats": repeats,
          "shards": shards, "size": size, "workers": workers, "log": _log}  # fmt: skip
    run_reported("bench_sources", run_sources_bench, report, work, out, **kw)


if __name__ == "__main__":
    main()
