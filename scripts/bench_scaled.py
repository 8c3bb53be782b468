#!/usr/bin/env python3
"""The scale-aware decode against its contract, per crop, for several gaps in one run:

for each photo set (the installed photographs as --resize fit records at 384 and 512 px,
the same converted to L in an RGB pack, camera-sized and ImageNet-sized cuts), quality,
output (224/160/112/64/32) and crop (RandomResizedCrop and eval), the loss in dB of the
loader's resample of the 1/2 decode against Pillow's BILINEAR of the full decode, both
against the original, beside the full decode's own (the measure's floor), and the share of
record pixels each gap decodes.

    python scripts/bench_scaled.py --out scaled.json      # the full run (minutes on 2 cores)
    python scripts/bench_scaled.py --quick                # seconds, to try it
    python scripts/bench_scaled.py --gaps 3,3.5,4 --qualities 75,90,95

Prints a markdown table and the verdict per gap, and writes the JSON; the logic is in
scripts/workbench/bench_scaled*.py.
"""

from __future__ import annotations

from pathlib import Path

import click
from workbench.bench_scaled import GAPS, QUALITIES, run_scaled_bench
from workbench.bench_scaled_report import report
from workbench.cli import bench_command
from workbench.report import run_reported


def _log(msg: str) -> None:
    click.echo(msg, err=True)


def _numbers(kind: type, low: float, high: float):
    """A click callback: a comma-separated list of ``kind`` in [low, high], sorted, unique."""

    def parse(ctx: click.Context, param: click.Parameter, value: str) -> tuple:
        try:
            found = tuple(sorted({kind(v) for v in value.split(",")}))
        except ValueError:
            raise click.BadParameter(f"expected comma-separated numbers, found {value!r}") from None
        if not all(low <= v <= high for v in found):
            raise click.BadParameter(f"each should be in [{low:g}, {high:g}], found {value!r}")
        return found

    return parse


@bench_command(
    quick="A few small images and outputs: seconds.",
    work="Keep the photos here (default: a temporary folder); its photos/ is made anew each run.",
)
@click.option(
    "--gaps",
    default=",".join(f"{g:g}" for g in GAPS),
    show_default=True,
    callback=_numbers(float, 1.0, 64.0),
    help="The gaps to judge: decode at 1/2 when the box is gap x the output there.",
)
@click.option(
    "--qualities",
    default=",".join(str(q) for q in QUALITIES),
    show_default=True,
    callback=_numbers(int, 1, 100),
    help="JPEG qualities of the records.",
)
def main(quick: bool, out: Path | None, work: Path | None, seed: int, gaps: tuple[float, ...],
         qualities: tuple[int, ...]) -> None:  # fmt: skip
    kw = {"quick": quick, "seed": seed, "gaps": gaps, "qualities": qualities, "log": _log}
    run_reported("bench_scaled", run_scaled_bench, report, work, out, **kw)


if __name__ == "__main__":
    main()
