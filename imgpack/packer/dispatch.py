"""The ``pack-images`` group: its first argument, when it names no subcommand, starts ``pack``.

Split from ``cli`` (the pack command): telling a source from a subcommand is its own rule.
"""

from __future__ import annotations

import os
import shlex

import click

from imgpack.console import PROG

__all__ = ["PackGroup"]


class PackGroup(click.Group):
    """A group whose first argument, when it names no subcommand, starts ``pack``.

    A source folder named like a subcommand (``info``, ``verify``, ...) is packed
    with ``pack-images pack info out.bin`` or ``pack-images ./info out.bin``. The
    short form ``pack-images info out.bin``, when ``info`` is a folder here and the
    arguments look like a pack rather than fit the subcommand, is refused with
    that advice instead of running the subcommand on the wrong thing.
    """

    default_command = "pack"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        group_options = (*ctx.help_option_names, "--version")
        if args and args[0] not in self.commands and args[0] not in group_options:
            args = [self.default_command, *args]
        elif args and args[0] in self.commands and self._ambiguous(ctx, args):
            rest = " ".join(shlex.quote(a) for a in args[1:]) or "OUT.bin"
            click.echo(
                f"{PROG}: error: '{args[0]}' is a subcommand and also a folder here; "
                f"to pack the folder run: {PROG} pack {shlex.quote(args[0])} {rest} "
                f"(or: {PROG} ./{shlex.quote(args[0])} {rest})",
                err=True,
            )
            raise click.exceptions.Exit(2)
        return super().parse_args(ctx, args)

    def _ambiguous(self, ctx: click.Context, args: list[str]) -> bool:
        """``args[0]`` is a folder, and the rest reads as a pack, not as that subcommand."""
        name, rest = args[0], args[1:]
        if not os.path.isdir(name) or any(a in ctx.help_option_names for a in rest):
            return False
        first = next((a for a in rest if not a.startswith("-")), None)
        if name != self.default_command and first and first.endswith(".bin"):
            if not os.path.exists(first):  # an output to make, not a pack to read
                return True
        try:
            self.commands[name].make_context(name, list(rest), parent=ctx)
        except click.UsageError:
            return True
        return False
