"""The options every ``scripts/bench_*.py`` with a quick mode shares, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click

__all__ = ["bench_command"]


def bench_command(quick: str, work: str) -> Callable[[Callable[..., Any]], click.Command]:
    """``click.command`` with --quick and --work (``quick``, ``work``: their help), --out and
    --seed, listed before the script's own options."""
    common = [
        click.option("--quick", is_flag=True, help=quick),
        click.option(
            "--out",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="Write the JSON result here.",
        ),
        click.option(
            "--work",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            help=work,
        ),
        click.option("--seed", type=int, default=0, show_default=True),
    ]

    def wrap(fn: Callable[..., Any]) -> click.Command:
        for option in reversed(common):  # click lists options in the reverse of application
            fn = option(fn)
        return click.command(context_settings={"help_option_names": ["-h", "--help"]})(fn)

    return wrap
