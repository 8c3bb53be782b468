#!/usr/bin/env python3
"""No GPU: every pack kind delivered to the CPU beside FFCV's CPU pipeline, in one run.

    python scripts/bench_cpu.py --out cpu.json       # minutes on 2 cores
    python scripts/bench_cpu.py --quick              # seconds, to try it

Prints a markdown table (images/s of each pipeline, medians over alternated epochs) and the
ratios issue 28 asks about; the logic is in scripts/workbench/bench_cpu.py.
"""

from __future__ import annotations

import click
from workbench.bench_cpu import report, run_cpu_bench
from workbench.cli import bench_command
from workbench.report import run_reported


@bench_command(
    quick="A few tiny photos and crops: seconds.",
    work="Make the photos and packs here (default: a temporary folder).",
)
def main(quick, out, work, seed) -> None:
    run_reported("bench_cpu", run_cpu_bench, report, work, out, quick=quick, seed=seed,
                 log=lambda m: click.echo(m, err=True))  # fmt: skip


if __name__ == "__main__":
    main()
