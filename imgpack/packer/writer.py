"""Stream records into a pack and publish it atomically.

``PackWriter`` is the only code that lays out bytes of a .bin; it appends
records in order to ``NAME.bin.partial``, keeps the small per-record columns
(labels, CRCs, paths) in compact arrays, and on ``finish()`` writes the trailing
sections and header, fsyncs, and renames into place, .bin first and .json last:
the .json appearing is the commit point. Nothing under the final names is ever
partial.
"""

from __future__ import annotations

import os
import shutil
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from imgpack import format as fmt
from imgpack.errors import InsufficientSpaceError
from imgpack.packer.inspect import human_bytes

__all__ = [
    "PackWriter",
    "RecordDigest",
    "digest_record",
    "digest_from_histogram",
    "partial_path",
    "check_free_space",
]

# (crc32, per-channel sums, per-channel sums of squares) of one HWC uint8 record
RecordDigest = tuple[int, tuple[int, int, int], tuple[int, int, int]]

_ROW = 768  # values per row that digest_record sums down: 256 RGB pixels
_BLOCK_ROWS = 256  # rows per block: keeps its uint16 and float32 column sums exact
_CHANNEL_OF_COLUMN = np.eye(fmt.CHANNELS)[np.arange(_ROW) % fmt.CHANNELS]  # (_ROW, 3) of 0/1
_LEVELS = np.arange(256, dtype=np.int64)[:, None] ** np.arange(3)  # (256, 3): 1, v, v**2


def digest_record(pixels: np.ndarray) -> RecordDigest:
    """CRC and exact channel sums of one record, given as a uint8 array of any shape.

    Workers use ``digest_from_histogram`` instead (cheaper right after a decode);
    this one serves records read back (resume) and ``append`` without a digest.

    The bytes are summed as rows of ``_ROW`` values (a multiple of 3, so column
    j holds channel j % 3), down blocks of at most 256 rows: uint16 column sums
    are then exact (256 * 255 < 2**16), and so are float32 sums of squares,
    since every partial sum is an integer below 256 * 255**2 < 2**24 (so any
    summation order gives the same, exact result).
    """
    arr = np.ascontiguousarray(pixels, dtype=np.uint8)
    flat = arr.reshape(-1)
    if flat.size % fmt.CHANNELS:
        raise ValueError(f"record has {flat.size} bytes, not a whole number of RGB pixels")
    full = flat.size - flat.size % _ROW
    rows = flat[:full].reshape(-1, _ROW)
    cols = np.zeros((2, _ROW))  # float64 column sums: exact far beyond any record's totals
    for k in range(0, rows.shape[0], _BLOCK_ROWS):
        block = rows[k : k + _BLOCK_ROWS]
        cols[0] += np.add.reduce(block, axis=0, dtype=np.uint16)
        wide = block.astype(np.float32)
        cols[1] += np.einsum("ij,ij->j", wide, wide)  # einsum, not BLAS: no threads in workers
    totals = cols @ _CHANNEL_OF_COLUMN  # (2, 3) per-channel totals; far too small to thread
    if full < flat.size:  # fewer than _ROW values left over
        tail = flat[full:].reshape(-1, fmt.CHANNELS).astype(np.float64)
        totals[0] += tail.sum(axis=0)
        totals[1] += (tail * tail).sum(axis=0)
    sums, sums_sq = totals.astype(np.uint64).tolist()
    return fmt.record_checksum(arr), tuple(sums), tuple(sums_sq)


def digest_from_histogram(data: Any, histogram: Sequence[int]) -> RecordDigest:
    """``digest_record`` of the RGB bytes ``data``, given their 768-bin histogram.

    The histogram is Pillow's ``Image.histogram()`` of the record's image (256
    counts for R, then G, then B): one C pass over pixels still in cache. Right
    after a decode every new numpy call costs microseconds of cold code, so the
    counts, sums and sums of squares of all three channels come from a single
    int64 product (exact: counts * 255**2 stay below 2**63).
    """
    counts = np.array(histogram, dtype=np.int64)
    pixels = len(memoryview(data).cast("B")) // fmt.CHANNELS
    if counts.shape != (3 * 256,):
        raise ValueError(f"histogram of {counts.size} bins, expected 768 (RGB)")
    (n0, s0, q0), (n1, s1, q1), (n2, s2, q2) = (counts.reshape(3, 256) @ _LEVELS).tolist()
    if not n0 == n1 == n2 == pixels:
        raise ValueError(f"histogram counts {n0} pixels, the record has {pixels}")
    return fmt.record_checksum(data), (s0, s1, s2), (q0, q1, q2)


def partial_path(out_bin: str | os.PathLike) -> Path:
    """Where an unfinished pack lives until it is complete."""
    out_bin = Path(out_bin)
    return out_bin.with_name(out_bin.name + ".partial")


def check_free_space(folder: str | os.PathLike, needed: int, *, what: str = "pack") -> None:
    """Refuse to start a write that cannot fit, instead of failing at 97%."""
    free = shutil.disk_usage(folder).free
    if needed > free:
        need, have = human_bytes(needed), human_bytes(free)
        if need == have:  # too close to tell apart at 3 digits
            need, have = f"{needed:,} bytes", f"{free:,} bytes"
        raise InsufficientSpaceError(f"{folder}: the {what} needs {need} but only {have} is free")


class PackWriter:
    """Append records in order, then ``finish()`` to publish NAME.bin + NAME.json.

    Use as a context manager: leaving the block by an exception calls ``abort()``
    (the partial file is kept for ``--resume`` unless ``discard_on_abort``).
    """

    def __init__(
        self,
        out_bin: str | os.PathLike,
        *,
        height: int,
        width: int,
        classes: list[str],
        discard_on_abort: bool = False,
    ) -> None:
        self.out_bin = Path(out_bin)
        self.out_json, _ = fmt.pack_paths(self.out_bin)
        self.partial = partial_path(self.out_bin)
        self.height, self.width = height, width
        self.record_bytes = height * width * fmt.CHANNELS
        self.classes = list(classes)
        self.discard_on_abort = discard_on_abort
        self.labels = array("i")
        self.crcs = array("I")
        self.path_offsets = array("Q", [0])
        self.paths = bytearray()
        self.sums = [0, 0, 0]
        self.sums_sq = [0, 0, 0]
        self.skipped: list[dict[str, str]] = []
        self._file = None

    # -- lifecycle ---------------------------------------------------------------

    def open(self, *, keep_records: int = 0) -> PackWriter:
        """Start a new partial file, or reopen one keeping its first ``keep_records`` records.

        Records kept on resume are re-read once to rebuild CRCs and sums, so a
        resumed pack is byte-identical to an uninterrupted one.
        """
        if keep_records:
            self._file = open(self.partial, "r+b")
            self._file.truncate(fmt.HEADER_BYTES + keep_records * self.record_bytes)
        else:
            self._file = open(self.partial, "wb")
            self._file.write(bytes(fmt.HEADER_BYTES))  # real header written by finish()
        self._file.seek(fmt.HEADER_BYTES + keep_records * self.record_bytes)
        return self

    def rescan_kept(self, kept: list[tuple[int, str]]) -> None:
        """Rebuild the columns for records kept by ``open(keep_records=len(kept))``."""
        mm = (
            np.memmap(
                self.partial,
                dtype=np.uint8,
                mode="r",
                offset=fmt.HEADER_BYTES,
                shape=(len(kept), self.height, self.width, fmt.CHANNELS),
            )
            if kept
            else []
        )
        for (label, relpath), rec in zip(kept, mm):
            self._add_columns(label, relpath, digest_record(rec))
        del mm

    def __enter__(self) -> PackWriter:
        if self._file is None:
            self.open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()

    def abort(self) -> None:
        """Close without publishing; the final names are untouched."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.discard_on_abort:
            self.partial.unlink(missing_ok=True)

    # -- writing -----------------------------------------------------------------

    @property
    def count(self) -> int:
        return len(self.labels)

    def append(
        self, pixels: Any, label: int, relpath: str, digest: RecordDigest | None = None
    ) -> None:
        """Write one HWC uint8 record (array or bytes of exactly record_bytes)."""
        buf = memoryview(pixels).cast("B") if not isinstance(pixels, np.ndarray) else None
        if buf is None:
            if pixels.shape != (self.height, self.width, fmt.CHANNELS) or pixels.dtype != np.uint8:
                raise ValueError(
                    f"{relpath}: record shape {pixels.shape} {pixels.dtype}, "
                    f"expected {(self.height, self.width, 3)} uint8"
                )
            buf = memoryview(np.ascontiguousarray(pixels)).cast("B")
        if len(buf) != self.record_bytes:
            raise ValueError(
                f"{relpath}: record has {len(buf)} bytes, expected {self.record_bytes}"
            )
        if digest is None:
            digest = digest_record(np.frombuffer(buf, dtype=np.uint8))
        self._file.write(buf)
        self._add_columns(label, relpath, digest)

    def add_kept(self, label: int, relpath: str, digest: RecordDigest) -> None:
        """Account for a record already in the partial file, its digest known (resume)."""
        self._add_columns(label, relpath, digest)

    def flush(self) -> None:
        """Hand every appended byte to the OS, so a journal may name those records."""
        self._file.flush()

    def _add_columns(self, label: int, relpath: str, digest: RecordDigest) -> None:
        crc, sums, sums_sq = digest
        self.labels.append(label)
        self.crcs.append(crc)
        self.paths += relpath.encode("utf-8")
        self.path_offsets.append(len(self.paths))
        for c in range(fmt.CHANNELS):
            self.sums[c] += sums[c]
            self.sums_sq[c] += sums_sq[c]

    def skip(self, relpath: str, reason: str) -> None:
        """Record a source file that produced no record, and why."""
        self.skipped.append({"path": relpath, "reason": reason})

    def finish(
        self, *, packer: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Write trailing sections and header, fsync, rename into place; return the index."""
        f = self._file
        n = self.count
        sections = fmt.layout_sections(n, self.record_bytes, len(self.paths))
        columns = {
            "labels": np.frombuffer(self.labels, dtype=np.int32).astype("<i4").tobytes(),
            "checksums": np.frombuffer(self.crcs, dtype=np.uint32).astype("<u4").tobytes(),
            "path_offsets": np.frombuffer(self.path_offsets, dtype=np.uint64)
            .astype("<u8")
            .tobytes(),
            "paths": bytes(self.paths),
        }
        for name, payload in columns.items():
            f.seek(sections[name].offset)
            f.write(payload)
        f.truncate(fmt.file_bytes(sections))
        f.seek(0)
        f.write(fmt.encode_header(n, self.height, self.width))
        f.flush()
        os.fsync(f.fileno())
        f.close()
        self._file = None

        index = fmt.build_index(
            data_file=self.out_bin.name,
            count=n,
            height=self.height,
            width=self.width,
            classes=self.classes,
            sections=sections,
            stats=fmt.stats_from_sums(n * self.height * self.width, self.sums, self.sums_sq),
            skipped=self.skipped,
            packer=packer,
            extra=extra,
        )
        # Drop a stale index first: a reader then sees "no pack", never old JSON over new pixels.
        self.out_json.unlink(missing_ok=True)
        os.replace(self.partial, self.out_bin)
        fmt.write_json_atomic(self.out_json, index)
        _fsync_dir(self.out_bin.parent)
        return index


def _fsync_dir(folder: Path) -> None:
    """Make the renames durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
