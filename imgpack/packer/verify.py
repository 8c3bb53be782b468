"""``pack-images verify``: whether a finished pack is intact, record by record.

Torch-free, and light on memory: ``verify`` streams the pixels through one
reused buffer (read, not mapped, so resident memory stays flat however large
the pack and a file truncated under our feet is an error, not a SIGBUS), checks
each record's CRC-32 at the offset its size gives (``PackIndex.record_offsets``:
records differ in size, and their bytes depend on the codec), and walks the path
section in bounded chunks. In a jpeg pack it also decodes every record whose CRC matches
(Pillow), since a stream stored damaged has the CRC of its damage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.errors import FormatError
from imgpack.format.fields import GEOMETRY_FIELDS
from imgpack.format.index import PackIndex
from imgpack.format.layout import pack_paths
from imgpack.format.write import record_checksum
from imgpack.packer.inspect import read_pack_index
from imgpack.packer.jpeg import decode_jpeg
from imgpack.packer.summary import progress_bar

__all__ = ["verify_pack", "VerifyReport"]

_CHUNK_BYTES = 64 << 20  # pixels read per step by verify
_PATH_CHUNK = 65536  # records whose paths are checked per step
_LISTED = 100  # bad records kept in a report with their details


@dataclass
class VerifyReport:
    """The outcome of ``verify_pack``; ``ok`` only if nothing at all was wrong."""

    path: Path
    count: int = 0
    checked: int = 0
    problems: list[str] = field(default_factory=list)
    bad_count: int = 0
    bad_records: list[dict[str, Any]] = field(default_factory=list)  # the first _LISTED
    decoded: bool = False  # jpeg: every record was also decoded

    @property
    def ok(self) -> bool:
        return not self.problems and not self.bad_count

    def lines(self, *, max_listed: int = 20) -> list[str]:
        if self.ok:
            decoded = ", every record decodes" if self.decoded else ""
            return [
                f"{self.path.name}: OK, {self.checked} records, every checksum matches{decoded}"
            ]
        out = list(self.problems)
        for b in self.bad_records[:max_listed]:
            if "reason" in b:
                out.append(f"record {b['record']} ({b['path']}): {b['reason']}")
            else:
                out.append(
                    f"record {b['record']} ({b['path']}): CRC-32 is {b['found']:08x}, "
                    f"packed as {b['expected']:08x}"
                )
        if self.bad_count > max_listed:
            out.append(f"... and {self.bad_count - max_listed} more damaged records")
        return out

    def summary(self) -> str:
        """One line saying what is wrong: the first problem, and the damaged-record count."""
        parts = []
        if self.problems:
            more = len(self.problems) - 1
            parts.append(self.problems[0] + (f" (and {more} more problems)" if more else ""))
        if self.bad_count:
            parts.append(f"{self.path.name}: {self.bad_count} of {self.count} records damaged")
        return "; ".join(parts) or f"{self.path.name}: OK"


def verify_pack(path: str | os.PathLike, *, progress: bool | None = None) -> VerifyReport:
    """Validate the index against the .bin, then recompute every record's CRC-32."""
    _, bin_path = pack_paths(path)
    report = VerifyReport(path=bin_path)
    try:
        index = read_pack_index(path)
    except FormatError as exc:
        report.problems.append(str(exc))
        return report
    report.count = index.count
    report.path = index.data_path
    _check_skipped(index, report)
    _check_geometry(index, report)
    offsets = index.read_section("path_offsets")
    with open(index.data_path, "rb") as f:
        paths_ok = _check_paths(index, offsets, f, report)
        crcs = index.read_section("checksums")
        _check_records(index, crcs, f, report, progress)
        if paths_ok:  # name the damaged records by their source files
            for b in report.bad_records:
                b["path"] = _read_path(index, offsets, f, b["record"])
    return report


def _check_skipped(index: PackIndex, report: VerifyReport) -> None:
    for k, item in enumerate(index.raw["skipped"]):
        if not (
            isinstance(item, dict) and all(isinstance(item.get(x), str) for x in ("path", "reason"))
        ):
            report.problems.append(
                f"{index.json_path.name}: skipped[{k}] should be {{path, reason}} strings"
            )
            return


def _check_geometry(index: PackIndex, report: VerifyReport) -> None:
    """Sizes positive; each source box inside its source, each content box inside the record."""
    if not any(f in index.fields for f in GEOMETRY_FIELDS) or not index.count:
        return
    sizes, sboxes, cboxes = index.geometry()
    slack = 1e-3  # float32 rounding of boxes computed in float64
    limits_s = np.concatenate([sizes, sizes], axis=1).astype(np.float64)
    own = index.record_sizes  # each content box lies inside its own record
    limits_c = np.concatenate([own, own], axis=1).astype(np.float64)
    checks = (
        ("source size is not positive", (sizes <= 0).any(axis=1)),
        ("source box lies outside the source", _bad_boxes(sboxes, limits_s, slack)),
        ("content box lies outside the record", _bad_boxes(cboxes, limits_c, slack)),
    )
    for what, bad in checks:
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            report.problems.append(
                f"{index.data_path.name}: record {i}: {what} ({int(bad.sum())} records)"
            )


def _bad_boxes(boxes: np.ndarray, limits: np.ndarray, slack: float) -> np.ndarray:
    b = boxes.astype(np.float64)
    with np.errstate(invalid="ignore"):
        ok = (
            np.isfinite(b).all(axis=1)
            & (b[:, 0] >= -slack)
            & (b[:, 1] >= -slack)
            & (b[:, 2] <= limits[..., 2] + slack)
            & (b[:, 3] <= limits[..., 3] + slack)
            & (b[:, 0] < b[:, 2])
            & (b[:, 1] < b[:, 3])
        )
    return ~ok


def _check_paths(index: PackIndex, offsets: np.ndarray, f, report: VerifyReport) -> bool:
    """Offsets never decrease; every path is non-empty UTF-8 cut on character boundaries."""
    name = index.data_path.name
    steps = np.diff(offsets.astype(np.int64))
    if (steps <= 0).any():
        i = int(np.flatnonzero(steps <= 0)[0])
        report.problems.append(
            f"{name}: path of record {i} spans {int(offsets[i])}..{int(offsets[i + 1])} "
            f"(each record needs a non-empty source path)"
        )
        return False
    base = index.sections["paths"].offset
    for a in range(0, index.count, _PATH_CHUNK):
        b = min(a + _PATH_CHUNK, index.count)
        lo, hi = int(offsets[a]), int(offsets[b])
        f.seek(base + lo)
        raw = f.read(hi - lo)
        starts = np.frombuffer(raw, np.uint8)[(offsets[a:b] - lo).astype(np.int64)]
        try:
            raw.decode("utf-8")
            torn = (starts & 0xC0) == 0x80  # a path starting inside a character
        except UnicodeDecodeError as exc:
            report.problems.append(f"{name}: source paths are not UTF-8 near byte {lo + exc.start}")
            return False
        if torn.any():
            i = a + int(np.flatnonzero(torn)[0])
            report.problems.append(f"{name}: path of record {i} starts inside a UTF-8 character")
            return False
    return True


def _read_path(index: PackIndex, offsets: np.ndarray, f, i: int) -> str:
    lo, hi = int(offsets[i]), int(offsets[i + 1])
    f.seek(index.sections["paths"].offset + lo)
    return f.read(hi - lo).decode("utf-8", "replace")


def _check_records(index, crcs, f, report: VerifyReport, progress: bool | None) -> None:
    """Every record's CRC-32, at the offset its size gives, read in chunks of whole records."""
    n, offsets = index.count, index.record_offsets
    biggest = int(np.diff(offsets).max()) if n else 0
    buf = bytearray(max(_CHUNK_BYTES, biggest))
    view = memoryview(buf)
    with progress_bar(progress, n, unit="rec", desc="verify") as bar:
        f.seek(index.data_offset)
        a = 0
        while a < n:  # records a..b-1 fill at most one buffer
            base = int(offsets[a])
            b = max(a + 1, int(np.searchsorted(offsets, base + len(buf), side="right")) - 1)
            size = int(offsets[b]) - base
            if f.readinto(view[:size]) != size:
                report.problems.append(f"{index.data_path.name}: pixels end early at record {a}")
                return
            for i in range(a, b):
                record = view[int(offsets[i]) - base : int(offsets[i + 1]) - base]
                crc = record_checksum(record)
                if crc != int(crcs[i]):
                    bad = {"record": i, "path": "?", "expected": int(crcs[i]), "found": crc}
                elif index.codec == "jpeg":
                    bad = _undecodable(index, i, record)
                else:
                    bad = None
                if bad is not None:
                    report.bad_count += 1
                    if len(report.bad_records) < _LISTED:
                        report.bad_records.append(bad)
            report.checked += b - a
            bar.update(b - a)
            a = b
        report.decoded = index.codec == "jpeg"


def _undecodable(index: PackIndex, i: int, record: memoryview) -> dict[str, Any] | None:
    """None when jpeg record ``i`` decodes to its size and channels; else what is wrong."""
    w, h = (int(v) for v in index.record_sizes[i])
    try:
        decode_jpeg(record, w, h, index.channels)
    except ValueError as e:
        return {"record": i, "path": "?", "reason": f"JPEG stream does not decode: {e}"}
    return None
