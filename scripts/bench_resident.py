#!/usr/bin/env python3
"""Streamed against resident (``make_loader(..., resident=True)``) on the CPU, side by side.

    python scripts/bench_resident.py --out resident.json     # a few minutes on 2 cores
    python scripts/bench_resident.py --quick                 # seconds, to try it

Prints a markdown table (images/s of each loader with a consumer that copies every batch,
medians over alternated epochs, and the first pass's copy); the logic is in
scripts/workbench/bench_resident.py.
"""

from __future__ import annotations

import click
from workbench.bench_resident import report, run_resident_bench
from workbench.cli import bench_command
from workbench.report import run_reported


@bench_command(
    quick="Two tiny packs: seconds.",
    work="Make the packs here (default: a temporary folder).",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--epochs", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--alternations", type=click.IntRange(min=1), default=3, show_default=True)
def main(quick, out, work, seed, batch_size, epochs, alternations) -> None:
    run_reported("bench_resident", run_resident_bench, report, work, out, quick=quick,
                 seed=seed, batch=batch_size, epochs=epochs, alternations=alternations,
                 log=lambda m: click.echo(m, err=True))  # fmt: skip


if __name__ == "__main__":
    main()
