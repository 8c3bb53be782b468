"""Look inside a finished pack: what it holds (``info``), and whether it is intact (``verify``).

Torch-free, and light on memory: ``verify`` streams the pixels through one
reused buffer (read, not mapped, so resident memory stays flat however large
the pack and a file truncated under our feet is an error, not a SIGBUS), and
walks the path section in bounded chunks.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.classlist import class_digest
from imgpack.errors import FormatError
from imgpack.format.fields import GEOMETRY_FIELDS, RECORD_FIELDS
from imgpack.format.index import PackIndex, read_index
from imgpack.format.layout import pack_paths
from imgpack.format.write import record_checksum

__all__ = ["pack_info", "info_lines", "verify_pack", "VerifyReport", "human_bytes"]

_CHUNK_BYTES = 64 << 20  # pixels read per step by verify
_PATH_CHUNK = 65536  # records whose paths are checked per step
_LISTED = 100  # bad records kept in a report with their details


def human_bytes(n: float) -> str:
    """1234567 -> '1.2 MB' (decimal units, like disk sizes)."""
    for unit in ("B", "kB", "MB", "GB"):
        if round(n, 1) < 1000:  # 999.96 kB is "1.0 MB", not "1000.0 kB"
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _read_pack_index(path: str | os.PathLike) -> PackIndex:
    """``read_index``, with a hint for the manifest ``merge`` wrote (it is no pack itself)."""
    from imgpack.manifest import is_manifest

    if Path(path).suffix == ".json" and is_manifest(path):
        raise FormatError(
            f"{Path(path).name}: is a manifest of shards (pack-images merge), not one pack; "
            f"run this on each shard it names"
        )
    return read_index(path)


def pack_info(path: str | os.PathLike) -> dict[str, Any]:
    """A validated summary of a pack: shape, classes with record counts, stats, settings."""
    index = _read_pack_index(path)
    raw = index.raw
    labels = index.read_section("labels") if index.count else np.zeros(0, np.int32)
    per_class = np.bincount(labels[labels >= 0], minlength=len(index.classes))
    return {
        "data_file": str(index.data_path),
        "index_file": str(index.json_path),
        "format_version": raw["format_version"],
        "count": index.count,
        "shape": list(index.shape),
        "dtype": raw["dtype"],
        "layout": raw["layout"],
        "record_bytes": index.record_bytes,
        "bytes": index.data_file_bytes,
        "classes": [
            {"label": i, "name": name, "count": int(per_class[i])}
            for i, name in enumerate(index.classes)
        ],
        "classes_digest": class_digest(index.classes),
        "unlabelled": int((labels < 0).sum()),
        "skipped": len(raw["skipped"]),
        "excluded": len(raw.get("excluded") or []),
        "stats": {"mean": list(index.mean), "std": list(index.std)},
        "packer": raw["packer"],
        "shard": raw.get("shard"),
        "channels": index.channels,
        "pack_id": index.pack_id,
        "fields": {name: f.to_json() for name, f in index.fields.items()},
    }


def info_lines(info: dict[str, Any], *, max_classes: int = 12) -> list[str]:
    """``pack_info`` for people, a few lines."""
    h, w, c = info["shape"]
    lines = [
        f"{Path(info['data_file']).name}: {info['count']} records of {h}x{w}x{c} "
        f"{info['dtype']} ({info['layout']}), {human_bytes(info['bytes'])}, "
        f"format version {info['format_version']}"
    ]
    classes = info["classes"]
    if classes:
        shown = ", ".join(f"{k['name']} {k['count']}" for k in classes[:max_classes])
        more = f", ... {len(classes) - max_classes} more" if len(classes) > max_classes else ""
        lines.append(f"classes: {len(classes)} ({shown}{more})")
        lines.append(f"class list digest: {info['classes_digest']} (same digest, same classes)")
    if info["unlabelled"]:
        lines.append(f"unlabelled records: {info['unlabelled']}")
    lines.append(_v2_line(info))
    lines.append(
        "mean: "
        + " ".join(f"{v:.4f}" for v in info["stats"]["mean"])
        + "   std: "
        + " ".join(f"{v:.4f}" for v in info["stats"]["std"])
    )
    if info["skipped"]:
        where = Path(info["index_file"]).name
        lines.append(f"skipped when packing: {info['skipped']} files (see {where} 'skipped')")
    if info.get("excluded"):
        where = Path(info["index_file"]).name
        n = info["excluded"]
        lines.append(f"left out when packing: {n} files or folders (see {where} 'excluded')")
    p = info["packer"]
    if "size" in p:
        lines.append(
            f"packed with: --size {p['size'][0]}x{p['size'][1]} --resize {p.get('resize')} "
            f"--filter {p.get('filter')} --labels {p.get('labels_file') or p.get('labels')} "
            + (f"--classes-from {p['classes_from']} " if p.get("classes_from") else "")
            + (f"--crop-ratio {p['crop_ratio']} " if p.get("crop_ratio", 1.0) != 1.0 else "")
            + (f"--channels {p['channels']} " if p.get("channels", 3) != 3 else "")
            + f"(imgpack {p.get('imgpack_version')}, Pillow {p.get('pillow')}, "
            f"source '{p.get('source')}')"
        )
    shard = info.get("shard")
    if shard and shard.get("count", 1) > 1:
        i, n = shard["index"], shard["count"]
        if shard.get("by") == "interleaved":
            held = f"source files {i}, {i + n}, {i + 2 * n}, ..."
        else:
            a, b = shard.get("source_range", ["?", "?"])
            held = f"source files {a}..{b}"
        lines.append(f"shard {i} of {n}: {held} of {shard['source_files']}")
    return lines


def _v2_line(info: dict[str, Any]) -> str:
    """Channels, geometry, target vectors and pack id in one line."""
    c = info.get("channels", 3)
    fields = info.get("fields", {})
    geometry = all(f in fields for f in GEOMETRY_FIELDS)
    targets = fields.get("targets")
    parts = [
        f"channels: {c} ({'grayscale' if c == 1 else 'RGB'})",
        "geometry: per record" if geometry else "geometry: none (records are whole sources)",
        f"targets: {targets['shape'][0]} per record" if targets else "targets: none",
        f"pack id {info.get('pack_id') or 'none (format version 1)'}",
    ]
    other = sorted(set(fields) - set(RECORD_FIELDS))
    if other:
        parts.append(f"other fields: {', '.join(other)}")
    return "; ".join(parts)


@dataclass
class VerifyReport:
    """The outcome of ``verify_pack``; ``ok`` only if nothing at all was wrong."""

    path: Path
    count: int = 0
    checked: int = 0
    problems: list[str] = field(default_factory=list)
    bad_count: int = 0
    bad_records: list[dict[str, Any]] = field(default_factory=list)  # the first _LISTED

    @property
    def ok(self) -> bool:
        return not self.problems and not self.bad_count

    def lines(self, *, max_listed: int = 20) -> list[str]:
        if self.ok:
            return [f"{self.path.name}: OK, {self.checked} records, every checksum matches"]
        out = list(self.problems)
        for b in self.bad_records[:max_listed]:
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
        index = _read_pack_index(path)
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
    limits_c = np.array([index.width, index.height] * 2, dtype=np.float64)
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
    rb, n = index.record_bytes, index.count
    per = max(1, _CHUNK_BYTES // rb)
    buf = bytearray(per * rb)
    view = memoryview(buf)
    bar = None
    if progress or (progress is None and sys.stderr.isatty()):
        from tqdm import tqdm

        bar = tqdm(total=n, unit="rec", file=sys.stderr, desc="verify")
    try:
        f.seek(index.data_offset)
        for a in range(0, n, per):
            k = min(per, n - a)
            got = f.readinto(view[: k * rb])
            if got != k * rb:
                report.problems.append(f"{index.data_path.name}: pixels end early at record {a}")
                return
            for j in range(k):
                crc = record_checksum(view[j * rb : (j + 1) * rb])
                if crc != int(crcs[a + j]):
                    report.bad_count += 1
                    if len(report.bad_records) < _LISTED:
                        report.bad_records.append(
                            {
                                "record": a + j,
                                "path": "?",
                                "expected": int(crcs[a + j]),
                                "found": crc,
                            }
                        )
            report.checked += k
            if bar is not None:
                bar.update(k)
    finally:
        if bar is not None:
            bar.close()
