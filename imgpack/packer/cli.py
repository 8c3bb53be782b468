"""``pack-images``: a thin click layer over ``pack_folder``, ``pack_info`` and ``verify_pack``.

``pack-images SRC... OUT.bin [options]`` packs (short for ``pack-images pack ...``: the
group's first argument, when it names no subcommand, starts ``pack``);
``pack-images info PACK`` and ``pack-images verify PACK`` inspect a pack (Torch-free; packing
loads what it needs only when it runs). A new subcommand is one ``main.add_command(...)``
line; wrap its body in ``reporting(debug)`` to get the same exit codes: 0 done, 1 failure
with one ``pack-images: error: ...`` line on stderr (``--debug``: the traceback), 2 usage
error, 128+N when stopped by signal N (130 for Ctrl-C).
"""

from __future__ import annotations

import os
import signal
import sys


def _interrupted(signum: int, frame) -> None:
    os.write(2, b"pack-images: interrupted\n")
    os._exit(128 + signum)


# Run as the command, Ctrl-C is an interrupt from the first line on: while Python imports the
# rest, and wherever a command's ``reporting`` does not turn it into its own line (click's
# "Aborted!" with status 1 never shows); nothing is written outside ``reporting``.
if os.path.basename(sys.argv[0]) == "pack-images":
    signal.signal(signal.SIGINT, _interrupted)

import json  # noqa: E402
import shlex  # noqa: E402
from contextlib import suppress  # noqa: E402
from pathlib import Path  # noqa: E402

import click  # noqa: E402

from imgpack import __version__  # noqa: E402
from imgpack.console import PROG, debug_option, quiet_option, reporting  # noqa: E402
from imgpack.format.layout import CODECS  # noqa: E402
from imgpack.packer.decode import FILTERS, RESIZE_MODES, DecodeSettings, parse_size  # noqa: E402
from imgpack.packer.discover import LABEL_MODES  # noqa: E402
from imgpack.packer.sources.folder import is_labels_file  # noqa: E402
from imgpack.packer.verify import info_lines, pack_info, stats_text, verify_pack  # noqa: E402
from imgpack.remote import has_url  # noqa: E402
from imgpack.shards import SHARD_BY  # noqa: E402
from imgpack.validate import json_or_none  # noqa: E402

__all__ = ["main"]


def _parse_labels(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value not in LABEL_MODES and not is_labels_file(value):
        raise click.BadParameter(
            f"{value!r}: expected folders, none, or a labels file NAME.csv / NAME.jsonl"
        )
    return value


def _need_output(ctx: click.Context, param: click.Parameter, value: tuple) -> tuple:
    """SRC... OUT.bin: with one argument, click gives it to OUT; it was the source (a
    usage error while parsing, so that the group's ambiguity check sees it too)."""
    if not value:
        raise click.UsageError("Missing argument 'OUT.bin'.", ctx=ctx)
    return value


class _LocalPath(click.Path):
    """info, verify and merge read local packs: a URL, which a Path would turn into a
    missing local file (``s3:/b/x.json: index not found``), is refused as a bad argument."""

    def convert(self, value: str, param: click.Parameter, ctx: click.Context) -> Path:
        if has_url(value):
            self.fail(
                f"{value}: a URL; '{ctx.info_name}' reads local packs (copy it here first; "
                f"PackedImageDataset reads it where it is)"
            )
        return Path(super().convert(value, param, ctx))


def _error(message: str, status: int = 2) -> None:
    """One ``pack-images: error:`` line on stderr, then exit: 2 a usage error, 1 a failure."""
    click.echo(f"{PROG}: error: {message}", err=True)
    raise click.exceptions.Exit(status)


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
            folder, rest = shlex.quote(args[0]), " ".join(map(shlex.quote, args[1:])) or "OUT.bin"
            _error(
                f"'{args[0]}' is a subcommand and also a folder here; to pack the folder run: "
                f"{PROG} pack {folder} {rest} (or: {PROG} ./{folder} {rest})"
            )
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


@click.group(cls=PackGroup, name=PROG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name=PROG)
def main() -> None:
    """Pack images into one NAME.bin of records plus a NAME.json index.

    \b
    pack-images SRC... OUT.bin [options]  pack a folder, tar shards or Parquet files
                                        (same as: pack-images pack ...)
    pack-images info PACK               what a pack holds
    pack-images verify PACK             recheck every checksum
    pack-images merge OUT.json SHARD... many packs as one dataset

    \b
    A source folder named like a subcommand: pack-images pack info out.bin
    (or pack-images ./info out.bin).
    """


@main.command("pack", context_settings={"show_default": True})
@click.argument("src", nargs=-1, metavar="SRC...", type=click.Path(), callback=_need_output)
@click.argument("out", metavar="OUT.bin", type=click.Path())  # paths or URLs (imgpack.remote)
@click.option(
    "--work",
    type=click.Path(path_type=Path),
    help="Where a pack for a URL OUT.bin (or URL sources) is made before the upload, and kept "
    "[default: a temporary folder, the same for the same command, removed once published]",
)
@click.option(
    "--size",
    default="224",
    help="Output size: N for NxN, or WIDTHxHEIGHT; with --resize fit, N: the longer side.",
)
@click.option(
    "--resize",
    type=click.Choice(RESIZE_MODES),
    default="center-crop",
    help="center-crop: cover then crop; stretch; pad: letterbox on black; fit: keep the "
    "aspect, the longer side SIZE (never up), each record at its own size.",
)
@click.option(
    "--codec",
    type=click.Choice(list(CODECS)),
    default="raw",
    help="raw: HWC pixels; yuv420: Y, then Cb and Cr at half resolution (half the bytes); "
    "jpeg: a JPEG per record (a tenth of the bytes; decoded when read).",
)
@click.option(
    "--quality",
    type=click.IntRange(1, 100),
    help="--codec jpeg: the JPEG quality.  [default: 90]",
)
@click.option(
    "--filter",
    type=click.Choice(list(FILTERS)),
    default="bilinear",
    help="Resampling filter (antialiased when shrinking).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    help="Decoding processes.  [default: all cores]",
)
@click.option(
    "--labels",
    default="folders",
    callback=_parse_labels,
    metavar="folders|none|FILE.csv|FILE.jsonl",
    help="folders: SRC/<class>/... (tar shards, Parquet: each sample's own label); none: "
    "every image, label -1; a labels file over a folder: columns path (relative to SRC), "
    "label, optional targets.",
)
@click.option(
    "--image-column",
    metavar="NAME",
    help="Parquet: the image column.  [default: the one binary or struct<bytes> column]",
)
@click.option(
    "--label-column",
    metavar="NAME|none",
    help="Parquet: the integer label column; none: no labels.  [default: label]",
)
@click.option(
    "--label-key",
    metavar="KEY",
    help="Tar shards: the label is this key's integer in each sample's .json, not its .cls.",
)
@click.option(
    "--classes-from",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="PACK|LIST.txt",
    help="Use exactly this class list and order: an earlier pack's .bin or .json, a "
    "manifest, or a text file with one class per line.",
)
@click.option(
    "--on-error",
    type=click.Choice(["skip", "fail"]),
    help="A bad image (or a class folder missing from --classes-from): skip and list it in the "
    "index, or stop, writing nothing.  [default: skip bad images, refuse such folders]",
)
@click.option("--force", is_flag=True, help="Overwrite an existing pack or interrupted run.")
@click.option(
    "--resume",
    is_flag=True,
    help="Continue an interrupted run, or fail if there is none or it differs (without it, "
    "a rerun of the same command continues too, and another command starts over).",
)
@click.option(
    "--num-shards",
    type=click.IntRange(min=1),
    default=1,
    help="Split the sorted file list (tar shards, Parquet: the samples, in order) into N parts ...",
)
@click.option(
    "--shard-index", type=click.IntRange(min=0), default=0, help="... and pack part I (0-based)."
)
@click.option(
    "--shard-by",
    type=click.Choice(SHARD_BY),
    default=SHARD_BY[0],
    help="contiguous: part I is the I-th run of files or samples (a few classes each); "
    "interleaved: every N-th one from I (every class in each part).",
)
@click.option(
    "--channels",
    type=click.Choice([3, 1]),
    default=3,
    help="3: RGB; 1: grayscale, Pillow's L (ITU-R 601-2 luma) of the RGB record.",
)
@click.option(
    "--crop-ratio",
    default=1.0,  # a float, as click infers from it
    help="center-crop: Resize(int(SIZE/R)) + CenterCrop(SIZE), as torchvision (0.875: the "
    "standard eval transform).",
)
@quiet_option
@debug_option
def pack_command(src, out, size, resume, quiet, debug, work, **options) -> None:
    """Pack the images of SRC into OUT.bin and OUT.json.

    \b
    SRC is a folder of class folders, or WebDataset tar shards or Parquet files: paths,
    globs and brace ranges ('train-{000000..000146}.tar'), packed in sorted order."""
    if options["resize"] == "fit" and not size.strip().isdigit():
        _error(f"--resize fit takes one --size S (the longer side), not {size!r}")
    shard, shards = options["shard_index"], options["num_shards"]
    if shard >= shards:
        raise click.BadParameter(
            f"{shard} is not below --num-shards {shards}", param_hint="--shard-index"
        )
    pixels = ("resize", "channels", "crop_ratio", "codec", "quality")
    try:  # the settings' own checks, before anything is listed: a usage error
        DecodeSettings(*parse_size(size), **{k: options[k] for k in pixels})
    except ValueError as exc:
        _error(str(exc))
    from imgpack.packer.pack import pack_folder
    from imgpack.remote.mirror import published, staged

    say = lambda line: click.echo(f"{PROG}: {line}", err=True)  # noqa: E731
    with reporting(debug):  # URLs: packed in a local folder, then uploaded (imgpack.remote)
        url = out  # a rerun of a published pack finds it there
        found = published(out) if has_url(out) and not options["force"] else None
        src, out, staging = staged(src, out, work, say)

    summary = None

    def stopped() -> str:  # asked once stopped: the records the same command finds kept
        kept = _kept(out) if summary is None else summary.count
        return f"interrupted with {kept:,} records kept; rerun the same command to continue"

    with reporting(debug, interrupted=stopped), staging:  # errors name the URLs given
        summary = pack_folder(
            src[0] if len(src) == 1 else list(src),
            out,
            size=parse_size(size),
            resume=True if resume else None,
            progress=False if quiet else None,
            notify=say,
            published=None if found is None else (url, found),
            **options,  # the rest, as pack_folder names them
        )
        if not quiet:  # Ctrl-C while this prints: exit 130 too, the pack's records kept
            click.echo("\n".join(summary.lines()), err=True)
        # a published pack found complete is not uploaded again
        staging.publish(upload=found is None or not summary.complete)


def _kept(out: Path) -> int:
    """Records the journal of an interrupted run names (none: 0), which a rerun keeps."""
    from imgpack.packer.journal import journal_path

    with suppress(OSError):
        lines = journal_path(out).read_bytes().splitlines()[1:]  # after the recipe
        # a record's line has its CRC (a skip's has none; a torn last line reads as None)
        return sum(isinstance(entry, dict) and "crc" in entry for entry in map(json_or_none, lines))
    return 0


@main.command("info")
@click.argument("pack", type=_LocalPath())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@debug_option
def info_command(pack, as_json, debug) -> None:
    """Show what PACK (NAME.bin or NAME.json) holds."""
    with reporting(debug):
        info = pack_info(pack)
    lines = [json.dumps(info, indent=1, ensure_ascii=False)] if as_json else info_lines(info)
    click.echo("\n".join(lines))


@main.command("verify")
@click.argument("pack", type=_LocalPath())
@quiet_option
@debug_option
def verify_command(pack, quiet, debug) -> None:
    """Recheck PACK: index against data file, paths, every record's CRC-32 (jpeg: and
    decode every record)."""
    with reporting(debug):
        report = verify_pack(pack, progress=False if quiet else None)
    if report.lines() != [report.summary()] and not (report.ok and quiet):
        click.echo("\n".join(report.lines()))  # the detail, on stdout where it says more
    if not report.ok:
        _error(report.summary(), status=1)


@main.command("merge")
@click.argument("out", metavar="OUT.manifest.json", type=_LocalPath(dir_okay=False))
@click.argument("shards", metavar="SHARD.bin...", nargs=-1, required=True, type=_LocalPath())
@click.option(
    "--allow-partial",
    is_flag=True,
    help="Accept a sharded pack with shards missing (warns; the manifest says partial).",
)
@click.option("--force", is_flag=True, help="Overwrite an existing manifest.")
@quiet_option
@debug_option
def merge_command(out, shards, allow_partial, force, quiet, debug) -> None:
    """Write OUT.manifest.json: the SHARD packs read as one dataset (no pixel copied)."""
    from imgpack.packer.merge import merge_packs

    with reporting(debug):
        manifest, warnings = merge_packs(out, shards, allow_partial=allow_partial, force=force)
    for warning in warnings:
        click.echo(f"{PROG}: warning: {warning}", err=True)
    h, w, _ = manifest["shape"]
    if not quiet:
        click.echo(
            f"merged {len(shards)} shards ({manifest['count']} records, {h}x{w}, "
            f"{len(manifest['classes'])} classes) into {out.name}; {stats_text(manifest['stats'])}",
            err=True,
        )


# Defined with the diagnostics (it imports torch only when it runs).
from imgpack.diagnose.tune import tune_command  # noqa: E402

main.add_command(tune_command)
