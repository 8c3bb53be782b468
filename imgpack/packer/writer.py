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
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.errors import InvalidArgumentError, SourceError
from imgpack.format.codec import rgb_to_yuv420
from imgpack.format.fields import RECORD_LENGTH, RECORD_SIZE, RecordGeometry
from imgpack.format.layout import (
    CHANNEL_COUNTS,
    CHANNELS,
    CODECS,
    HEADER_BYTES,
    encode_header,
    file_bytes,
    layout_fields,
    layout_sections,
    pack_paths,
    record_nbytes,
)
from imgpack.format.write import build_index, compute_pack_id, stats_from_sums, write_json_atomic
from imgpack.packer.columns import RecordColumns
from imgpack.packer.digest import RecordDigest, digest_stored
from imgpack.packer.jpeg import (
    DEFAULT_QUALITY,
    SUBSAMPLING,
    check_quality,
    encode_jpeg,
    max_jpeg_bytes,
)
from imgpack.packer.sources.source import printable_path

__all__ = ["PackWriter", "partial_path", "check_size", "check_geometry", "check_target"]


def partial_path(out_bin: str | os.PathLike) -> Path:
    """Where an unfinished pack lives until it is complete."""
    out_bin = Path(out_bin)
    return out_bin.with_name(out_bin.name + ".partial")


class PackWriter:
    """Append records in order, then ``finish()`` to publish NAME.bin + NAME.json (version 3).

    ``height`` x ``width`` is the bound: a record may have any size within it. ``codec``
    "raw" stores HWC pixels as given, "yuv420" (3 channels) Y, Cb, Cr planes
    (``imgpack.format.codec``), "jpeg" a JPEG stream per record, encoded at ``quality``
    (default 90; no other codec takes one). ``channels``: 3 (RGB) or 1 (L); ``target_dim`` K > 0:
    a float32 target vector of K values per record (``append(..., target=...)``).
    Every record has a geometry (``append(..., geometry=...)``; None: its whole
    source), written as the ``source_size``/``source_box``/``content_box`` fields.
    Use as a context manager: leaving the block by an exception calls ``abort()``
    (the partial file is kept for ``--resume``).
    """

    def __init__(
        self,
        out_bin: str | os.PathLike,
        *,
        height: int,
        width: int,
        classes: list[str],
        channels: int = CHANNELS,
        target_dim: int = 0,
        codec: str = "raw",
        quality: int | None = None,
    ) -> None:
        if channels not in CHANNEL_COUNTS:
            raise ValueError(f"channels must be 1 or 3, got {channels!r}")
        if codec not in CODECS:
            raise InvalidArgumentError(f"codec must be one of {', '.join(CODECS)}, got {codec!r}")
        if codec == "yuv420" and channels != 3:
            raise InvalidArgumentError(f"codec yuv420 stores 3 channels, got channels={channels}")
        if codec != "jpeg" and quality is not None:
            raise InvalidArgumentError(f"quality is for codec jpeg, not {codec}")
        if isinstance(target_dim, bool) or not isinstance(target_dim, int) or target_dim < 0:
            raise ValueError(f"target_dim must be a whole number >= 0, got {target_dim!r}")
        self.out_bin = Path(out_bin)
        self.out_json, _ = pack_paths(self.out_bin)
        self.partial = partial_path(self.out_bin)
        self.height, self.width, self.channels = height, width, channels
        self.codec = codec
        self.quality = None
        if codec == "jpeg":
            self.quality = check_quality(DEFAULT_QUALITY if quality is None else quality)
            self.max_record_bytes = max_jpeg_bytes(width, height, channels)  # usually
        else:
            self.max_record_bytes = record_nbytes(codec, width, height, channels)
        self.target_dim = target_dim
        self.classes = list(classes)
        self.columns = RecordColumns(codec, channels, target_dim)
        self.skipped: list[dict[str, str]] = []
        self.published = False  # finish() renamed the pack into place
        self._file = None

    # -- lifecycle ---------------------------------------------------------------

    def open(self, *, keep_records: int = 0) -> PackWriter:
        """Start a new partial file, or reopen one keeping its first ``keep_records`` records.

        Records kept on resume are re-read once to rebuild CRCs and sums, so a
        resumed pack is byte-identical to an uninterrupted one; they must have been
        accounted for with ``add_kept`` first, which knows their sizes: the file is cut
        where the last of them ends.
        """
        if keep_records != self.count:
            raise InvalidArgumentError(
                f"keep_records={keep_records}, but {self.count} records were accounted for"
            )
        end = HEADER_BYTES + self.columns.pixels_nbytes
        if keep_records:
            self._file = open(self.partial, "r+b")
            self._file.truncate(end)
        else:
            self._file = open(self.partial, "wb")
            self._file.write(bytes(HEADER_BYTES))  # real header written by finish()
        self._file.seek(end)
        return self

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

    # -- writing -----------------------------------------------------------------

    @property
    def count(self) -> int:
        return self.columns.count

    def append(
        self,
        pixels: Any,
        label: int,
        relpath: str,
        digest: RecordDigest | None = None,
        *,
        geometry: RecordGeometry | None = None,
        target: Sequence[float] | None = None,
        size: tuple[int, int] | None = None,
        as_is: bool = False,
    ) -> None:
        """Write one record: an (h, w, C) uint8 array within the bound, or its stored bytes.

        An array is stored as is (raw) or encoded (yuv420, jpeg). Bytes (any buffer) are the
        record as stored of ``size`` (width, height; default: the bound); ``as_is``: jpeg
        bytes that are a source file's own (the index counts them). ``digest``: its
        ``digest_stored`` (None: computed; jpeg bytes are decoded for it, so a stream that
        is not a JPEG of ``size`` is refused). ``geometry``: where it came from (None: its
        whole source); ``target``: its K floats (``target_dim`` K).
        """
        if isinstance(pixels, np.ndarray) and pixels.ndim == 3:
            h, w, c = pixels.shape
            if pixels.dtype != np.uint8 or c != self.channels:
                raise InvalidArgumentError(
                    f"{relpath}: record shape {pixels.shape} {pixels.dtype}, expected "
                    f"(h, w, {self.channels}) uint8 within {self.height}x{self.width}"
                )
            size = check_size(relpath, (w, h), self.width, self.height)
            stored = np.ascontiguousarray(pixels)
            if self.codec == "yuv420":
                stored = rgb_to_yuv420(stored)
            elif self.codec == "jpeg":
                stored = np.frombuffer(encode_jpeg(stored, self.quality), np.uint8)
            buf = memoryview(stored).cast("B")
        else:
            buf = memoryview(pixels).cast("B")
            size = (self.width, self.height) if size is None else tuple(size)
        w, h = check_size(relpath, size, self.width, self.height)
        self._check_length(relpath, len(buf), w, h)
        check_geometry(relpath, geometry)
        check_target(relpath, target, self.target_dim)
        if digest is None:
            try:
                digest = digest_stored(buf, self.codec, w, h, self.channels)
            except ValueError as e:  # jpeg bytes that do not decode to this record
                raise InvalidArgumentError(f"{relpath}: {e}") from None
        self._file.write(buf)
        self.columns.add(label, relpath, digest, geometry, target, (w, h), len(buf), as_is)

    def _check_length(self, relpath: str, n: int, w: int, h: int) -> None:
        if self.codec == "jpeg":
            if not 2 <= n < 2**32:
                raise InvalidArgumentError(
                    f"{relpath}: a jpeg record has 2 to 2**32 - 1 bytes, got {n}"
                )
            return
        need = record_nbytes(self.codec, w, h, self.channels)
        if n != need:
            raise InvalidArgumentError(
                f"{relpath}: record has {n} bytes, a {w}x{h} {self.codec} record has {need}"
            )

    def add_kept(
        self,
        label: int,
        relpath: str,
        digest: RecordDigest,
        *,
        geometry: RecordGeometry | None = None,
        target: Sequence[float] | None = None,
        size: tuple[int, int] | None = None,
        length: int | None = None,
        as_is: bool = False,
    ) -> None:
        """Account for a record already in the partial file, its digest and ``size`` (width,
        height; default: the bound) known (resume); jpeg: its ``length`` in bytes too."""
        w, h = check_size(
            relpath, (self.width, self.height) if size is None else size, self.width, self.height
        )
        if self.codec == "jpeg":
            if length is None:
                raise InvalidArgumentError(f"{relpath}: a kept jpeg record needs its length")
            self._check_length(relpath, length, w, h)
        check_geometry(relpath, geometry)
        check_target(relpath, target, self.target_dim)
        self.columns.add(label, relpath, digest, geometry, target, (w, h), length, as_is)

    def flush(self) -> None:
        """Hand every appended byte to the OS, so a journal may name those records."""
        if self._file is not None:  # closed: finish() or abort() already handed everything
            self._file.flush()

    def skip(self, relpath: str, reason: str) -> None:
        """Record a source file that produced no record, and why (its name as JSON holds it)."""
        self.skipped.append({"path": printable_path(relpath), "reason": reason})

    def finish(
        self, *, packer: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Write trailing sections and header, fsync, rename into place; return the index."""
        f = self._file
        n = self.count
        # first what can fail on bad sums (a damaged journal): the partial file stays as it is
        cols = self.columns
        stats = stats_from_sums(cols.pixels, cols.sums, cols.sums_sq)
        sections = layout_sections(n, cols.pixels_nbytes, len(cols.paths))
        columns, specs = cols.payloads()
        fields = layout_fields(sections, n, specs)
        for name in (RECORD_SIZE, RECORD_LENGTH):  # they say how to read the records
            if name in fields:
                fields[name] = replace(fields[name], required=True)
        pack_id = compute_pack_id(
            shape=(self.height, self.width, self.channels),
            count=n,
            classes=self.classes,
            payloads=list(columns.values()),
            codec=self.codec,
        )
        places = {**sections, **fields}
        for name, payload in columns.items():
            f.seek(places[name].offset)
            f.write(payload)
        f.truncate(file_bytes(sections, fields))
        f.seek(0)
        f.write(
            encode_header(
                n,
                self.height,
                self.width,
                channels=self.channels,
                pack_id=pack_id,
                pixels_nbytes=cols.pixels_nbytes,
                codec=self.codec,
            )
        )
        f.flush()
        os.fsync(f.fileno())
        f.close()
        self._file = None

        index = build_index(
            data_file=self.out_bin.name,
            count=n,
            height=self.height,
            width=self.width,
            classes=self.classes,
            sections=sections,
            stats=stats,
            skipped=self.skipped,
            packer=packer,
            extra=extra,
            channels=self.channels,
            fields=fields,
            pack_id=pack_id.hex(),
            codec=self.codec,
            jpeg=self._jpeg_entry(),
        )
        with _ctrl_c_deferred():  # a Ctrl-C stops the run once the pack is whole
            # Drop a stale index first: a reader then sees "no pack", never old JSON over new
            # pixels.
            self.out_json.unlink(missing_ok=True)
            os.replace(self.partial, self.out_bin)
            write_json_atomic(self.out_json, index)
            self.published = True
            _fsync_dir(self.out_bin.parent)
        return index

    def _jpeg_entry(self) -> dict[str, Any] | None:
        """The index's ``jpeg`` object: how the records were encoded, and how many were not."""
        if self.codec != "jpeg":
            return None
        return {
            "quality": self.quality,
            "subsampling": SUBSAMPLING[self.channels],
            "stored_as_is": self.columns.stored_as_is,
        }


# -- what PackWriter checks of each record, before any byte of it is written: a one-line
# error naming the record's source path


def check_size(relpath: str, size: Any, width: int, height: int) -> tuple[int, int]:
    """(width, height) of a record: whole numbers within the bound ``width`` x ``height``."""
    try:
        w, h = (int(v) for v in size)
        ok = all(int(v) == v for v in size)
    except (TypeError, ValueError):
        ok = False
    if not ok or not (1 <= w <= width and 1 <= h <= height):
        raise InvalidArgumentError(
            f"{relpath}: record size {size!r} is not (width, height) within the bound "
            f"{width}x{height}"
        )
    return w, h


def check_geometry(relpath: str, geometry: RecordGeometry | None) -> None:
    """None, or ((width, height), source box, content box) with a positive size."""
    if geometry is None:
        return
    try:
        size, sbox, cbox = geometry
        ok = (
            len(size) == 2
            and all(not isinstance(v, bool) and v == int(v) and 0 < v < 2**32 for v in size)
            and len(sbox) == 4
            and len(cbox) == 4
            and all(isinstance(float(v), float) for v in (*sbox, *cbox))
        )
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(
            f"{relpath}: geometry {geometry!r} is not ((width, height), source box, "
            f"content box) with a positive size and boxes of 4 numbers"
        )


def check_target(relpath: str, target: Sequence[float] | None, k: int) -> None:
    """K numbers when the pack holds K per record; None when it holds none (K = 0)."""
    if target is not None:
        try:
            np.asarray(target, dtype=np.float32)
        except (TypeError, ValueError):
            raise SourceError(f"{relpath}: target vector {target!r} is not numbers") from None
    if (target is None) != (k == 0) or (target is not None and len(target) != k):
        got = "none" if target is None else f"{len(target)} values"
        raise SourceError(f"{relpath}: target vector has {got}, the pack holds {k} per record")


@contextmanager
def _ctrl_c_deferred() -> Iterator[None]:
    """Ctrl-C in the block takes effect as it ends: a run stopped as it publishes leaves the
    whole pack, never a .bin without its .json. Only the main thread handles signals;
    elsewhere, or where SIGINT has no Python handler, the block runs as it is."""
    old = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(old):
        yield
        return
    caught: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if caught:
        old(signal.SIGINT, None)  # Python's default handler raises KeyboardInterrupt


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
