#!/usr/bin/env python3
"""Train a small CNN from a pack with device-side RandomResizedCrop and progressive sizes.

    python scripts/train_example.py --train train.bin --val val.bin --sizes 96,128 \\
        --epochs 4 --checkpoint ckpt.pt --device cuda

The loop is in scripts/workbench/train_example.py; this file only parses flags.
"""

from __future__ import annotations

import sys

import click
from workbench.train_example import train
from workbench.train_options import (
    checkpoint_option,
    seed_option,
    stop_after_option,
    workers_option,
)

from imgpack.errors import ImgpackError


def _sizes(ctx, param, value: str) -> list[int]:
    try:
        sizes = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated sizes, found {value!r}") from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"expected sizes >= 1, found {value!r}")
    return sizes


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--train", "train_pack", required=True, help="The training pack (.bin or .json).")
@click.option("--val", "val_pack", default=None, help="A validation pack, evaluated each epoch.")
@click.option(
    "--sizes",
    default="96,128",
    show_default=True,
    callback=_sizes,
    help="Training crop sizes, spread over the epochs (progressive resizing).",
)
@click.option(
    "--eval-size",
    type=click.IntRange(min=1),
    default=None,
    help="Validation crop size.  [default: the current training size]",
)
@click.option("--epochs", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0), default=0.1, show_default=True)
@seed_option
@workers_option
@checkpoint_option
@stop_after_option
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
def main(**options) -> None:
    """Train a small CNN with DeviceTransform.train, progressive sizes and the meter."""
    try:
        train(**options)
    except ImgpackError as exc:
        click.echo(f"train_example: error: {exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
