"""What the packer tells people: what a pack holds (``pack_info``, ``pack-images info``),
whether it is intact (``verify_pack``), and what a pack run did (``PackSummary``).

``pack_info`` reads the index and the labels, never the pixels.
``verify`` checks a finished pack record by record.

Torch-free, and light on memory: ``verify`` streams the pixels through one
reused buffer (read, not mapped, so resident memory stays flat however large
the pack and a file truncated under our feet is an error, not a SIGBUS), checks
each record's CRC-32 at the offset its size gives (``PackIndex.record_offsets``:
records differ in size, and their bytes depend on the codec), and reads the paths
one at a time. In a jpeg pack it also decodes every record whose CRC matches
(Pillow), since a stream stored damaged has the CRC of its damage.
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
from imgpack.packer.discover import left_out_text
from imgpack.packer.jpeg import decode_jpeg
from imgpack.shards import is_manifest
from imgpack.validate import is_str_list

__all__ = ["PackSummary", "VerifyReport", "info_lines", "pack_info", "stats_text", "verify_pack"]

_READ_BUFFER = 1 << 20  # bytes verify reads from the pack at a time
_LISTED = 20  # damaged records a report names, with their paths


@dataclass
class VerifyReport:
    """The outcome of ``verify_pack``; ``ok`` only if nothing at all was wrong."""

    path: Path
    count: int = 0
    problems: list[str] = field(default_factory=list)
    bad_count: int = 0
    bad_records: list[dict[str, Any]] = field(default_factory=list)  # the first _LISTED
    decoded: bool = False  # jpeg: every record was also decoded

    ok = property(lambda self: not self.problems and not self.bad_count)

    def lines(self) -> list[str]:
        """What verify found, for people: the OK line, or every problem and damaged record."""
        if self.ok:
            decoded = ", every record decodes" if self.decoded else ""
            return [f"{self.path.name}: OK, {self.count} records, every checksum matches{decoded}"]
        listed = [f"record {b['record']} ({b['path']}): {b['reason']}" for b in self.bad_records]
        if self.bad_count > len(listed):
            listed.append(f"... and {self.bad_count - len(listed)} more damaged records")
        return self.problems + listed

    def summary(self) -> str:
        """One line saying what is wrong: the first problem, and the damaged-record count."""
        parts = [_some(self.problems, 1)] if self.problems else []  # the first, and how many more
        if self.bad_count:
            parts.append(f"{self.path.name}: {self.bad_count} of {self.count} records damaged")
        return "; ".join(parts) or f"{self.path.name}: OK"


def verify_pack(path: str | os.PathLike, *, progress: bool | None = None) -> VerifyReport:
    """Validate the index against the .bin, then recompute every record's CRC-32."""
    report = VerifyReport(path=pack_paths(path)[1])  # the .bin, until the index names it
    try:
        index = read_pack_index(path)
    except FormatError as exc:
        report.problems.append(str(exc))
        return report
    report.count, report.path = index.count, index.data_path
    for k, item in enumerate(index.raw["skipped"]):  # what the index says of each
        if not (isinstance(item, dict) and is_str_list([item.get("path"), item.get("reason")])):
            report.problems.append(
                f"{index.json_path.name}: skipped[{k}] should be {{path, reason}} strings"
            )
            break
    _check_geometry(index, report)
    with open(index.data_path, "rb", buffering=_READ_BUFFER) as f:
        _check_records(index, index.read_section("checksums"), f, report, progress)
        _check_paths(index, f, report)  # and names the damaged records by their paths
    return report


def _check_geometry(index: PackIndex, report: VerifyReport) -> None:
    """Sizes positive; each source box inside its source, each content box inside the record
    (a pack without geometry: whole records, which pass)."""
    sizes, sboxes, cboxes = index.geometry()
    checks = (
        ("source size is not positive", (sizes <= 0).any(axis=1)),
        ("source box lies outside the source", _bad_boxes(sboxes, sizes)),
        ("content box lies outside the record", _bad_boxes(cboxes, index.record_sizes)),
    )  # each content box lies inside its own record
    for what, bad in checks:
        if bad.any():
            first, n = int(np.flatnonzero(bad)[0]), int(bad.sum())
            report.problems.append(f"{index.data_path.name}: record {first}: {what} ({n} records)")


def _bad_boxes(boxes: np.ndarray, sizes: np.ndarray, slack: float = 1e-3) -> np.ndarray:
    """Boxes not inside (0, 0, width, height), ``slack`` for float32 rounding."""
    b, bound = boxes.astype(np.float64), np.tile(sizes, 2) + slack  # (w, h, w, h)
    inside = ((b >= -slack) & (b <= bound)).all(axis=1)  # NaN is never inside
    return ~(inside & (b[:, 0] < b[:, 2]) & (b[:, 1] < b[:, 3]))


def _check_paths(index: PackIndex, f, report: VerifyReport) -> None:
    """Every path is non-empty UTF-8 (so none is cut inside a character: the path before
    the cut would end in half a character), read one at a time through ``f``'s buffer, its
    offsets rising. The damaged records found before get their paths, up to the first bad
    one (after it: "?")."""
    name, offsets = index.data_path.name, index.read_section("path_offsets").tolist()
    damaged = {b["record"]: b for b in report.bad_records}
    f.seek(index.sections["paths"].offset)
    for i, (start, end) in enumerate(zip(offsets, offsets[1:])):
        try:
            path = f.read(end - start).decode("utf-8") if end > start else ""
        except UnicodeDecodeError:
            path = ""
        if not path:  # an empty or a backward range, or bytes that are not UTF-8
            report.problems.append(f"{name}: path of record {i} is empty or not UTF-8")
            return
        if i in damaged:
            damaged[i]["path"] = path


def _check_records(index, crcs, f, report: VerifyReport, progress: bool | None) -> None:
    """Every record's CRC-32, read one after another (``f`` buffers the reads) into one
    buffer the size of the largest record."""
    sizes = np.diff(index.record_offsets).tolist()
    view = memoryview(bytearray(max(sizes, default=0)))
    with progress_bar(progress, index.count, unit="rec", desc="verify") as bar:
        f.seek(index.data_offset)
        for i, size in enumerate(sizes):
            record = view[:size]
            if f.readinto(record) != size:
                report.problems.append(f"{index.data_path.name}: pixels end early at record {i}")
                return
            crc, why = record_checksum(record), None
            if crc != int(crcs[i]):
                why = f"CRC-32 is {crc:08x}, packed as {int(crcs[i]):08x}"
            elif index.codec == "jpeg":  # a stream stored damaged has its damage's CRC
                try:
                    size = map(int, index.record_sizes[i])  # (width, height)
                    decode_jpeg(record, *size, index.channels, where="JPEG stream does not decode")
                except ValueError as e:  # "JPEG stream does not decode: damaged JPEG record (...)"
                    why = str(e)
            if why is not None:
                report.bad_count += 1
                if len(report.bad_records) < _LISTED:
                    report.bad_records.append({"record": i, "path": "?", "reason": why})
            bar.update()
        report.decoded = index.codec == "jpeg"


# -- pack-images info


def source_unit(packer: dict[str, Any]) -> str:
    """What one place of the source listing is, by the index's ``packer`` field: a sample
    of tar shards or Parquet files (many to a file), else a file."""
    return "sample" if packer.get("source_kind") in ("tar", "parquet") else "file"


def human_bytes(n: float) -> str:
    """1234567 -> '1.2 MB' (decimal units, like disk sizes)."""
    for unit in ("B", "kB", "MB", "GB"):
        if round(n, 1) < 1000:  # 999.96 kB is "1.0 MB", not "1000.0 kB"
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def read_pack_index(path: str | os.PathLike) -> PackIndex:
    """``read_index``, with a hint for the manifest ``merge`` wrote (it is no pack itself)."""
    if Path(path).is_file() and is_manifest(path):  # a .json, as is_manifest asks
        raise FormatError(
            f"{Path(path).name}: is a manifest of shards (pack-images merge), not one pack; "
            f"run this on each shard it names"
        )
    return read_index(path)


def pack_info(path: str | os.PathLike) -> dict[str, Any]:
    """A validated summary of a pack: shape, classes with record counts, stats, settings."""
    index = read_pack_index(path)
    raw = index.raw
    labels = index.read_section("labels")
    per_class = np.bincount(labels[labels >= 0], minlength=len(index.classes))
    sizes = index.record_sizes
    lo, hi = (sizes.min(axis=0), sizes.max(axis=0)) if index.count else ((0, 0), (0, 0))
    return {
        "data_file": str(index.data_path),
        "index_file": str(index.json_path),
        **{k: raw[k] for k in ("format_version", "count", "shape", "dtype", "layout", "codec")},
        "packer": raw["packer"],
        # jpeg: {"quality", "subsampling", "stored_as_is"}, as the index says; else None
        "jpeg": dict(raw["jpeg"]) if index.codec == "jpeg" else None,
        "record_bytes": index.record_bytes,  # None unless every record is H x W raw
        # [min, max] of the records' heights and widths (the shape is their bound)
        "record_heights": [int(lo[1]), int(hi[1])],
        "record_widths": [int(lo[0]), int(hi[0])],
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
        "shard": raw.get("shard"),
        "channels": index.channels,
        "pack_id": index.pack_id,
        "fields": {name: f.to_json() for name, f in index.fields.items()},
    }


def info_lines(info: dict[str, Any], *, max_classes: int = 12) -> list[str]:
    """``pack_info`` for people, a few lines."""
    h, w, c = info["shape"]
    (h0, h1), (w0, w1) = info["record_heights"], info["record_widths"]  # [min, max] each
    sizes = f"of {h}x{w}x{c}"
    if (h0, h1, w0, w1) != (h, h, w, w) and info["count"]:  # records of several sizes
        sizes = f"up to {h}x{w}x{c} (heights {h0}..{h1}, widths {w0}..{w1})"
    lines = [
        f"{Path(info['data_file']).name}: {info['count']} records {sizes} "
        f"{info['dtype']} ({info['layout']}), codec {info['codec']}, "
        f"{human_bytes(info['bytes'])}, format version {info['format_version']}"
    ]
    if info["jpeg"]:
        lines.append(_jpeg_text(info["count"], info["jpeg"]))
    classes = info["classes"]
    if classes:
        shown = _some([f"{k['name']} {k['count']}" for k in classes], max_classes)
        lines.append(f"classes: {len(classes)} ({shown})")
        lines.append(f"class list digest: {info['classes_digest']} (same digest, same classes)")
    if info["unlabelled"]:
        lines.append(f"unlabelled records: {info['unlabelled']}")
    c, fields = info["channels"], info["fields"]
    other = sorted(set(fields) - set(RECORD_FIELDS))  # fields another writer added
    geometry, targets = all(f in fields for f in GEOMETRY_FIELDS), fields.get("targets")
    parts = [
        f"channels: {c} ({'grayscale' if c == 1 else 'RGB'})",
        "geometry: per record" if geometry else "geometry: none (records are whole sources)",
        f"targets: {targets['shape'][0]} per record" if targets else "targets: none",
        f"pack id {info['pack_id']}",
        *([f"other fields: {', '.join(other)}"] if other else []),
    ]
    lines += ["; ".join(parts), stats_text(info["stats"])]
    where, n = Path(info["index_file"]).name, info["excluded"]
    if info["skipped"]:
        lines.append(f"skipped when packing: {info['skipped']} files (see {where} 'skipped')")
    if n:
        lines.append(f"left out when packing: {n} files or folders (see {where} 'excluded')")
    p = info["packer"]
    if "size" in p:  # the options that made the pack, as typed
        size = p["size"][0] if p.get("resize") == "fit" else "{}x{}".format(*p["size"])
        labels = p.get("labels_file") or p.get("labels")  # a labels file: by its name
        options = [f"--size {size} --resize {p.get('resize')} --filter {p.get('filter')}"]
        for key in _SHOWN.split():  # the others, where given and not the default
            value = labels if key == "labels" else p.get(key)
            if value is not None and value != _DEFAULTS.get(key):
                options.append(f"--{key.replace('_', '-')} {value}")
        lines.append(
            f"packed with: {' '.join(options)} (imgpack {p.get('imgpack_version')}, "
            f"Pillow {p.get('pillow')}, source '{p.get('source')}')"
        )
    shard = info["shard"]
    if shard and shard.get("count", 1) > 1:  # a field the packer adds: other writers may not
        i, n = shard["index"], shard["count"]
        a, b = shard.get("source_range", ["?", "?"])  # contiguous: its files a..b
        held = (
            f"{i}, {i + n}, {i + 2 * n}, ..." if shard.get("by") == "interleaved" else f"{a}..{b}"
        )
        what = f"source {source_unit(p)}s {held}"
        lines.append(f"shard {i} of {n}: {what} of {shard['source_files']}")
    return lines


# the options of the index's packer field that info shows when given (None: not given)
# and not their default (None where not named here); "samples": the labels tar shards and
# Parquet files carry
_SHOWN = "labels image_column label_column label_key classes_from crop_ratio channels codec quality"
_DEFAULTS = {"labels": "samples", "crop_ratio": 1.0, "channels": 3, "codec": "raw"}


def _jpeg_text(count: int, jpeg: dict[str, Any]) -> str:
    """A jpeg pack's records, as ``info`` and the pack summary say them: the settings of those
    encoded; the others keep their source's own."""
    encoded, kept = _n(count - jpeg["stored_as_is"], "record"), jpeg["stored_as_is"]
    return (
        f"jpeg: {encoded} encoded at quality {jpeg['quality']}, {jpeg['subsampling']}; {kept} "
        f"stored as they came (the source's own JPEG, with its own quality and subsampling)"
    )


def stats_text(stats: dict[str, Any]) -> str:
    """A pack's (or a manifest's) mean and std in one phrase: ``info`` and ``merge`` say
    them alike."""
    mean, std = (" ".join(f"{v:.4f}" for v in stats[k]) for k in ("mean", "std"))
    return f"mean: {mean}   std: {std}"


# -- what a pack run did


@dataclass
class PackSummary:
    """What one ``pack_folder`` run did; ``index`` is the JSON index as written, which the
    totals are read from.

    ``excluded``: what the walk of SRC left out; ``empty_classes``: classes that kept
    their label with no image; ``complete``: the pack was already there, made by the same
    command, and nothing was done.
    """

    out_bin: Path
    index: dict[str, Any]
    seconds: float
    processed: int
    resumed: int
    empty_classes: list[str] = field(default_factory=list)
    complete: bool = False

    def __post_init__(self) -> None:  # the totals, read from the index
        self.count, self.skipped = self.index["count"], self.index["skipped"]
        self.bytes = self.index["data_file_bytes"]
        self.excluded = self.index.get("excluded", [])

    def lines(self, *, show_skipped: int = 5) -> list[str]:
        """A closing summary for people: totals, then what did not go in, and why."""
        name, size = self.out_bin.name, human_bytes(self.bytes)
        if self.complete:  # made by the same command from the same files
            out = [f"{name} is already complete ({_n(self.count, 'image')}, {size}): nothing to do"]
        else:
            out = [
                f"packed {_n(self.count, 'image')} into {name} ({size}), skipped "
                f"{len(self.skipped)}; {_n(self.processed, source_unit(self.index['packer']))} "
                f"in {self.seconds:.1f} s, {self.processed / max(self.seconds, 1e-6):.1f} images/s"
                + (f" (resumed after {self.resumed})" if self.resumed else "")
            ]
        where = self.out_bin.with_suffix(".json").name
        if self.index.get("jpeg"):
            out.append(_jpeg_text(self.count, self.index["jpeg"]))
        if self.skipped:
            shown = _some([f"{s['path']} ({s['reason']})" for s in self.skipped], show_skipped)
            out.append(f"skipped: {shown}; see {where} 'skipped'")
        left = left_out_text([(e["path"], e["reason"]) for e in self.excluded])
        if left:
            out.append(f"left out: {left}; see {where} 'excluded'")
        hidden = self.index.get("excluded_hidden", 0)
        if hidden:
            out.append(f"left out: {_n(hidden, 'hidden or system file')} (.*, Thumbs.db, ...)")
        if self.empty_classes:
            shown = _some(self.empty_classes, 10)
            out.append(f"classes with no images (their labels are kept): {shown}")
        return out


def _some(items: list[str], shown: int) -> str:
    """The first ``shown`` items, and how many more: a long list in one line."""
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


def _n(count: int, noun: str) -> str:
    """'1 image', '2 images': a summary line reads as English at any count."""
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def progress_bar(progress: bool | None, total: int, **bar: Any):
    """A tqdm bar on stderr, drawn when ``progress`` is True (None: when stderr is a
    terminal), ``bar`` its own keywords (unit, initial, desc); not drawn, it is a no-op with
    the same methods, and starts no thread."""
    from tqdm import tqdm  # when a run starts: keeps `import imgpack.packer.pack` light

    disable = None if progress is None else not progress  # None: tqdm asks isatty()
    return tqdm(
        total=total, file=sys.stderr, smoothing=0.05, dynamic_ncols=True, disable=disable, **bar
    )
