"""The flags both training examples take (train_example, train_ddp): one definition each."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["seed_option", "workers_option", "checkpoint_option", "stop_after_option"]

seed_option = click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
workers_option = click.option(
    "--workers", type=click.IntRange(min=0), default=None, help="DataLoader workers."
)
checkpoint_option = click.option(
    "--checkpoint",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Save here after every epoch; resume from it when it exists.",
)
stop_after_option = click.option(
    "--stop-after",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after this many steps (checkpoint saved), like a preemption.",
)
