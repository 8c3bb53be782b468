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

from imgpack.errors import PackError, SourceError
from imgpack.format.fields import GEOMETRY_FIELDS, RECORD_FIELDS, RecordGeometry, whole_record
from imgpack.format.layout import (
    CHANNEL_COUNTS,
    CHANNELS,
    HEADER_BYTES,
    encode_header,
    file_bytes,
    layout_fields,
    layout_sections,
    pack_paths,
)
from imgpack.format.write import build_index, compute_pack_id, stats_from_sums, write_json_atomic
from imgpack.packer.digest import RecordDigest, digest_record
from imgpack.packer.inspect import human_bytes

__all__ = ["PackWriter", "partial_path", "check_free_space"]


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
        raise PackError(f"{folder}: the {what} needs {need} but only {have} is free")


class PackWriter:
    """Append records in order, then ``finish()`` to publish NAME.bin + NAME.json (version 2).

    ``channels`` is 3 (RGB) or 1 (L); ``target_dim`` K > 0 gives every record a
    float32 target vector of K values (``append(..., target=...)``). Every record
    has a geometry (``append(..., geometry=...)``; None: the record is its whole
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
    ) -> None:
        if channels not in CHANNEL_COUNTS:
            raise ValueError(f"channels must be 1 or 3, got {channels!r}")
        if isinstance(target_dim, bool) or not isinstance(target_dim, int) or target_dim < 0:
            raise ValueError(f"target_dim must be a whole number >= 0, got {target_dim!r}")
        self.out_bin = Path(out_bin)
        self.out_json, _ = pack_paths(self.out_bin)
        self.partial = partial_path(self.out_bin)
        self.height, self.width, self.channels = height, width, channels
        self.record_bytes = height * width * channels
        self.target_dim = target_dim
        self.classes = list(classes)
        self.labels = array("i")
        self.crcs = array("I")
        self.path_offsets = array("Q", [0])
        self.paths = bytearray()
        self.source_sizes = array("I")
        self.source_boxes = array("f")
        self.content_boxes = array("f")
        self.targets = array("f")
        self.sums = [0] * channels
        self.sums_sq = [0] * channels
        self.skipped: list[dict[str, str]] = []
        self._whole = whole_record(width, height)
        self._file = None

    # -- lifecycle ---------------------------------------------------------------

    def open(self, *, keep_records: int = 0) -> PackWriter:
        """Start a new partial file, or reopen one keeping its first ``keep_records`` records.

        Records kept on resume are re-read once to rebuild CRCs and sums, so a
        resumed pack is byte-identical to an uninterrupted one.
        """
        if keep_records:
            self._file = open(self.partial, "r+b")
            self._file.truncate(HEADER_BYTES + keep_records * self.record_bytes)
        else:
            self._file = open(self.partial, "wb")
            self._file.write(bytes(HEADER_BYTES))  # real header written by finish()
        self._file.seek(HEADER_BYTES + keep_records * self.record_bytes)
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
        return len(self.labels)

    def append(
        self,
        pixels: Any,
        label: int,
        relpath: str,
        digest: RecordDigest | None = None,
        *,
        geometry: RecordGeometry | None = None,
        target: Sequence[float] | None = None,
    ) -> None:
        """Write one HWC uint8 record (array or bytes of exactly record_bytes).

        ``geometry`` says where the record came from (None: its whole source);
        ``target`` is its K floats when the writer has ``target_dim`` K.
        """
        shape = (self.height, self.width, self.channels)
        buf = memoryview(pixels).cast("B") if not isinstance(pixels, np.ndarray) else None
        if buf is None:
            if pixels.shape != shape or pixels.dtype != np.uint8:
                raise ValueError(
                    f"{relpath}: record shape {pixels.shape} {pixels.dtype}, expected {shape} uint8"
                )
            buf = memoryview(np.ascontiguousarray(pixels)).cast("B")
        if len(buf) != self.record_bytes:
            raise ValueError(
                f"{relpath}: record has {len(buf)} bytes, expected {self.record_bytes}"
            )
        self._check_geometry(relpath, geometry)
        self._check_target(relpath, target)
        if digest is None:
            digest = digest_record(np.frombuffer(buf, dtype=np.uint8), self.channels)
        self._file.write(buf)
        self._add_columns(label, relpath, digest, geometry, target)

    def add_kept(
        self,
        label: int,
        relpath: str,
        digest: RecordDigest,
        *,
        geometry: RecordGeometry | None = None,
        target: Sequence[float] | None = None,
    ) -> None:
        """Account for a record already in the partial file, its digest known (resume)."""
        self._check_geometry(relpath, geometry)
        self._check_target(relpath, target)
        self._add_columns(label, relpath, digest, geometry, target)

    def flush(self) -> None:
        """Hand every appended byte to the OS, so a journal may name those records."""
        if self._file is not None:  # closed: finish() or abort() already handed everything
            self._file.flush()

    @staticmethod
    def _check_geometry(relpath: str, geometry: RecordGeometry | None) -> None:
        if geometry is None:
            return
        try:
            size, sbox, cbox = geometry
            ok = (
                len(size) == 2
                and all(isinstance(int(v), int) and v == int(v) and 0 < v < 2**32 for v in size)
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

    def _check_target(self, relpath: str, target: Sequence[float] | None) -> None:
        k = self.target_dim
        if target is not None:
            try:
                np.asarray(target, dtype=np.float32)
            except (TypeError, ValueError):
                raise SourceError(f"{relpath}: target vector {target!r} is not numbers") from None
        if (target is None) != (k == 0) or (target is not None and len(target) != k):
            got = "none" if target is None else f"{len(target)} values"
            raise SourceError(f"{relpath}: target vector has {got}, the pack holds {k} per record")

    def _add_columns(self, label, relpath, digest: RecordDigest, geometry, target) -> None:
        crc, sums, sums_sq = digest
        self.labels.append(label)
        self.crcs.append(crc)
        self.paths += relpath.encode("utf-8")
        self.path_offsets.append(len(self.paths))
        size, sbox, cbox = self._whole if geometry is None else geometry
        self.source_sizes.extend(size)
        self.source_boxes.extend(sbox)
        self.content_boxes.extend(cbox)
        if target is not None:
            self.targets.extend(target)
        for c in range(self.channels):
            self.sums[c] += sums[c]
            self.sums_sq[c] += sums_sq[c]

    def skip(self, relpath: str, reason: str) -> None:
        """Record a source file that produced no record, and why."""
        self.skipped.append({"path": relpath, "reason": reason})

    def _payloads(self) -> tuple[dict[str, bytes], list[tuple[str, str, tuple[int, ...]]]]:
        """Bytes of the sections after the pixels and of the record fields; the fields' specs."""
        columns = {
            "labels": np.frombuffer(self.labels, dtype=np.int32).astype("<i4").tobytes(),
            "checksums": np.frombuffer(self.crcs, dtype=np.uint32).astype("<u4").tobytes(),
            "path_offsets": np.frombuffer(self.path_offsets, dtype=np.uint64)
            .astype("<u8")
            .tobytes(),
            "paths": bytes(self.paths),
            "source_size": np.frombuffer(self.source_sizes, np.uint32).astype("<u4").tobytes(),
            "source_box": np.frombuffer(self.source_boxes, np.float32).astype("<f4").tobytes(),
            "content_box": np.frombuffer(self.content_boxes, np.float32).astype("<f4").tobytes(),
        }
        specs = [(n, RECORD_FIELDS[n].dtype, RECORD_FIELDS[n].shape) for n in GEOMETRY_FIELDS]
        if self.target_dim:
            columns["targets"] = np.frombuffer(self.targets, np.float32).astype("<f4").tobytes()
            specs.append(("targets", "<f4", (self.target_dim,)))
        return columns, specs

    def finish(
        self, *, packer: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Write trailing sections and header, fsync, rename into place; return the index."""
        f = self._file
        n = self.count
        # first what can fail on bad sums (a damaged journal): the partial file stays as it is
        stats = stats_from_sums(n * self.height * self.width, self.sums, self.sums_sq)
        sections = layout_sections(n, self.record_bytes, len(self.paths))
        columns, specs = self._payloads()
        fields = layout_fields(sections, n, specs)
        pack_id = compute_pack_id(
            shape=(self.height, self.width, self.channels),
            count=n,
            classes=self.classes,
            payloads=list(columns.values()),
        )
        places = {**sections, **fields}
        for name, payload in columns.items():
            f.seek(places[name].offset)
            f.write(payload)
        f.truncate(file_bytes(sections, fields))
        f.seek(0)
        f.write(encode_header(n, self.height, self.width, channels=self.channels, pack_id=pack_id))
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
        )
        # Drop a stale index first: a reader then sees "no pack", never old JSON over new pixels.
        self.out_json.unlink(missing_ok=True)
        os.replace(self.partial, self.out_bin)
        write_json_atomic(self.out_json, index)
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
