"""Resume: continue an interrupted run of the same recipe, or start afresh, and say why.

``journal`` reads and writes the journal's lines; this is where they meet the
run's recipe and the partial data file: ``begin`` decides whether the run
continues, and ``restore`` keeps the journalled records the partial file still
holds intact, believing or redoing each one.
"""

from __future__ import annotations

import os
from typing import Any

from imgpack.errors import PackError
from imgpack.format.fields import RecordGeometry
from imgpack.format.layout import HEADER_BYTES, record_nbytes
from imgpack.format.write import record_checksum
from imgpack.packer.discover import printable_path
from imgpack.packer.journal import Journal
from imgpack.packer.recipe import recipe_diff
from imgpack.packer.writer import PackWriter

__all__ = ["begin", "restore", "nothing_to_resume"]


def nothing_to_resume(name: str) -> PackError:
    """``--resume`` means "continue or fail": with no interrupted run, fail, and say so."""
    return PackError(
        f"cannot resume {name}: nothing to resume (no interrupted pack of it here); "
        f"run the same command without --resume to pack it"
    )


def begin(
    journal: Journal,
    name: str,
    writer: PackWriter,
    files: list[tuple[str, int]],
    recipe: dict[str, Any],
    *,
    resume: bool | None,
    targets: list | None = None,
    stamps: list[tuple[int, int]],
) -> int:
    """Continue the interrupted run that the (locked) ``journal`` describes, or start afresh;
    open ``writer`` to match. Returns how many files are done.

    ``resume`` True: continue, or fail if the run was made differently; None (a plain
    rerun): continue when the run matches, else start over and keep the reason in
    ``journal.restarted``; False: start afresh. ``targets[i]`` is file i's target vector
    (None: the pack has none).
    """
    readable, then = journal.header() if resume is not False else (True, None)
    if not readable and resume:
        raise journal.unreadable(name)
    if not readable:
        journal.restarted = "its journal is not one this imgpack understands"
    why = recipe_diff(then, recipe) if then is not None else None
    if why and resume is None:
        then, journal.restarted = None, why
    if then is None and resume:
        raise nothing_to_resume(name)
    if then is None:
        journal.start(recipe)
        writer.open()
        return 0
    if why:
        raise PackError(
            f"cannot resume {name}: {why}; rerun with the original settings "
            f"or use --force to start over"
        )
    if not writer.partial.exists() and writer.out_bin.exists():
        # stopped (killed, disk full) after the finished .bin took its name, before its
        # .json: every record is there to keep, and finish() writes the rest again
        os.replace(writer.out_bin, writer.partial)
    return restore(journal, writer, files, targets, stamps)


def restore(
    journal: Journal,
    writer: PackWriter,
    files: list[tuple[str, int]],
    targets: list | None,
    stamps: list[tuple[int, int]],
) -> int:
    """Keep the journalled outcomes whose records the partial file still holds intact, up
    to the first whose source file changed since (its ``stamps``: ``journal.changed`` then
    names it): that one and those after it are packed again.

    Records follow each other at the offsets their journalled sizes give
    (``record_nbytes``; jpeg: their journalled lengths), exactly as the finished pack
    will place them.
    """
    try:
        f = open(writer.partial, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        f = None
    with open(journal.path, "rb") as jf:
        keep_offset = len(jf.readline())  # the header line
    kept = done = 0
    try:
        left = max(0, os.fstat(f.fileno()).st_size - HEADER_BYTES) if f else 0
        if f is not None:
            f.seek(HEADER_BYTES)
        for entry, end in journal.entries(files):
            if entry["st"] != list(stamps[done]):
                journal.changed = entry["path"]
                break
            if "skip" in entry:
                writer.skip(printable_path(entry["path"]), entry["skip"])
            else:
                # the bytes must still be there and match the CRC the worker computed
                w, h = entry["size"]
                if (
                    len(entry["sum"]) != writer.channels
                    or not (w <= writer.width and h <= writer.height)
                    or not _sums_possible(entry, w * h)
                ):
                    break
                nbytes = _nbytes(writer, entry)
                if (
                    nbytes is None
                    or nbytes > left
                    or record_checksum(f.read(nbytes)) != entry["crc"]
                ):
                    break
                left -= nbytes
                writer.add_kept(
                    files[done][1],
                    entry["path"],
                    (entry["crc"], tuple(entry["sum"]), tuple(entry["sum_sq"])),
                    geometry=_geometry(entry),
                    target=None if targets is None else targets[done],
                    size=(w, h),
                    length=entry.get("len"),
                    as_is=entry.get("as_is", False),
                )
                kept += 1
            done += 1
            keep_offset = end
    finally:
        if f is not None:
            f.close()
    journal.truncate(keep_offset)
    writer.open(keep_records=kept)
    return done


def _nbytes(writer: PackWriter, entry: dict[str, Any]) -> int | None:
    """A journalled record's bytes: from its size, or (jpeg) its ``len``; None if the line
    lacks what the pack's codec needs (that record is redone)."""
    if writer.codec == "jpeg":
        return entry.get("len")
    w, h = entry["size"]
    return record_nbytes(writer.codec, w, h, writer.channels)


def _sums_possible(entry: dict[str, Any], pixels: int) -> bool:
    """Channel sums that ``pixels`` uint8 values can have; the CRC does not cover them.

    Per channel: 0 <= sum <= 255 * pixels, sum_sq <= 255 * sum (each v*v <= 255*v) and
    sum**2 <= pixels * sum_sq (Cauchy-Schwarz). A journal digit changed in place that
    stays possible is still believed: the pack's stats then follow it.
    """
    return all(
        0 <= s <= 255 * pixels and q <= 255 * s and s * s <= pixels * q
        for s, q in zip(entry["sum"], entry["sum_sq"])
    )


def _geometry(entry: dict[str, Any]) -> RecordGeometry | None:
    geo = entry.get("geo")
    if not geo:
        return None
    return RecordGeometry((geo[0], geo[1]), tuple(geo[2:6]), tuple(geo[6:10]))
