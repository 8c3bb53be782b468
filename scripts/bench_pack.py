#!/usr/bin/env python3
"""Packing benchmark: a naive Pillow loop vs pack-images at 1, 2 and all workers, plus ablations.

    python scripts/bench_pack.py --out results.json   # the full run, on a quiet machine
    python scripts/bench_pack.py --quick              # tiny sizes, seconds, to try it

Prints a markdown table for docs/benchmarks.md on stdout (progress on stderr).
The logic is in scripts/workbench/bench_pack.py; this file only parses flags.
"""

from __future__ import annotations

import shlex
import sys
import tempfile
from pathlib import Path

import click
from click.core import ParameterSource
from workbench.bench_pack import QUICK, run_pack_benchmark
from workbench.bench_pack_report import markdown_report, write_json

from imgpack.errors import ImgpackError


def _workers(ctx, param, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        counts = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise click.BadParameter(f"expected comma-separated counts >= 1, found {value!r}")
    return counts


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--imagenet-images",
    type=click.IntRange(min=1),
    default=600,
    show_default=True,
    help="ImageNet-like JPEGs (~400x350); rounded down to a multiple of 10 classes.",
)
@click.option(
    "--large-images",
    type=click.IntRange(min=1),
    default=40,
    show_default=True,
    help="Large photos (short side >= 2000 px); rounded down the same way.",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Timed passes per row; the median is reported.",
)
@click.option("--size", type=click.IntRange(min=1, max=4096), default=224, show_default=True)
@click.option(
    "--workers",
    default=None,
    callback=_workers,
    help="pack-images worker counts, e.g. 1,2,4,8 (default: 1, 2 and all cores).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep the sample folders and packs here (default: a temp dir, removed).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="Write the full result as JSON here.",
)
@click.option(
    "--quick", is_flag=True, help="Tiny sizes (20 + 2 images, 2 repeats) unless given explicitly."
)
@click.pass_context
def main(ctx, out, quick, workdir, **kw) -> None:
    if quick:
        for name, value in QUICK.items():
            if ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE:
                kw[name] = value
    if out is not None and not out.parent.is_dir():
        raise click.BadParameter(f"{out.parent}: folder does not exist", param_hint="--out")
    command = shlex.join(["python", "scripts/bench_pack.py", *sys.argv[1:]])
    with tempfile.TemporaryDirectory(prefix="bench_pack-") as tmp:
        result = run_pack_benchmark(workdir=workdir or tmp, command=command, **kw)
    if out is not None:
        write_json(out, result)
    click.echo(markdown_report(result))


if __name__ == "__main__":
    try:
        main()
    except ImgpackError as exc:
        print(f"bench_pack: error: {exc}", file=sys.stderr)
        sys.exit(1)
