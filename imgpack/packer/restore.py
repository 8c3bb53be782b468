"""Resume restore: keep the journalled outcomes whose records the partial file still holds.

Split from ``journal`` (which reads and writes the journal's lines): this is where those
lines meet the partial data file, and where a record is believed or redone.
"""

from __future__ import annotations

import os
import zlib
from typing import TYPE_CHECKING, Any

from imgpack.format.fields import RecordGeometry
from imgpack.format.layout import HEADER_BYTES
from imgpack.packer.fingerprint import printable_path
from imgpack.packer.writer import PackWriter

if TYPE_CHECKING:  # journal imports this module
    from imgpack.packer.journal import Journal

__all__ = ["restore"]


def restore(
    journal: Journal,
    writer: PackWriter,
    files: list[tuple[str, int]],
    targets: list | None = None,
) -> int:
    """Keep the journalled outcomes whose records the partial file still holds intact."""
    rb = writer.record_bytes
    try:
        f = open(writer.partial, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        f = None
    with open(journal.path, "rb") as jf:
        keep_offset = len(jf.readline())  # the header line
    kept = done = 0
    try:
        have = max(0, (os.fstat(f.fileno()).st_size - HEADER_BYTES) // rb) if f else 0
        if f is not None:
            f.seek(HEADER_BYTES)
        buf = bytearray(rb)
        for entry, end in journal.entries(files):
            if "skip" in entry:
                writer.skip(printable_path(entry["path"]), entry["skip"])
            else:
                # the bytes must still be there and match the CRC the worker computed
                if (
                    len(entry["sum"]) != writer.channels
                    or kept >= have
                    or not _sums_possible(entry, rb // writer.channels)
                    or f.readinto(buf) != rb
                    or zlib.crc32(buf) != entry["crc"]
                ):
                    break
                writer.add_kept(
                    files[done][1],
                    entry["path"],
                    (entry["crc"], tuple(entry["sum"]), tuple(entry["sum_sq"])),
                    geometry=_geometry(entry),
                    target=None if targets is None else targets[done],
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
