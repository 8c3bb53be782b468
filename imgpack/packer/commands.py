"""``pack-images info`` and ``pack-images verify``: the two subcommands that look at a pack.

Split from ``cli`` (which packs); each loads what it needs only when it runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from imgpack.console import PROG, debug_option, quiet_option, reporting

__all__ = ["info_command", "verify_command"]


@click.command("info")
@click.argument("pack", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@debug_option
def info_command(pack, as_json, debug) -> None:
    """Show what PACK (NAME.bin or NAME.json) holds."""
    from imgpack.packer.inspect import info_lines, pack_info

    with reporting(debug):
        info = pack_info(pack)
    if as_json:
        click.echo(json.dumps(info, indent=1, ensure_ascii=False))
    else:
        for line in info_lines(info):
            click.echo(line)


@click.command("verify")
@click.argument("pack", type=click.Path(path_type=Path))
@quiet_option
@debug_option
def verify_command(pack, quiet, debug) -> None:
    """Recheck PACK: index against data file, paths, every record's CRC-32 (jpeg: and
    decode every record)."""
    from imgpack.packer.verify import verify_pack

    with reporting(debug):
        report = verify_pack(pack, progress=False if quiet else None)
    if not report.ok:
        summary = report.summary()
        if report.lines() != [summary]:  # the detail on stdout only where it says more
            for line in report.lines():
                click.echo(line)
        click.echo(f"{PROG}: error: {summary}", err=True)
        raise click.exceptions.Exit(1)
    if not quiet:
        for line in report.lines():
            click.echo(line)
