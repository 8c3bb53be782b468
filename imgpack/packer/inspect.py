"""Look inside a finished pack: what it holds (``info``); whether it is intact is ``verify``.

Torch-free: ``pack_info`` reads the index and the labels, never the pixels.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.classlist import class_digest
from imgpack.errors import FormatError
from imgpack.format.fields import GEOMETRY_FIELDS, RECORD_FIELDS
from imgpack.format.index import PackIndex, read_index

__all__ = ["pack_info", "info_lines", "read_pack_index", "human_bytes", "source_unit"]


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
    from imgpack.manifest import is_manifest

    if Path(path).suffix == ".json" and Path(path).is_file() and is_manifest(path):
        raise FormatError(
            f"{Path(path).name}: is a manifest of shards (pack-images merge), not one pack; "
            f"run this on each shard it names"
        )
    return read_index(path)


def pack_info(path: str | os.PathLike) -> dict[str, Any]:
    """A validated summary of a pack: shape, classes with record counts, stats, settings."""
    index = read_pack_index(path)
    raw = index.raw
    labels = index.read_section("labels") if index.count else np.zeros(0, np.int32)
    per_class = np.bincount(labels[labels >= 0], minlength=len(index.classes))
    sizes = index.record_sizes
    lo, hi = (sizes.min(axis=0), sizes.max(axis=0)) if index.count else ((0, 0), (0, 0))
    return {
        "data_file": str(index.data_path),
        "index_file": str(index.json_path),
        "format_version": raw["format_version"],
        "count": index.count,
        "shape": list(index.shape),
        "dtype": raw["dtype"],
        "layout": raw["layout"],
        "codec": index.codec,
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
        "packer": raw["packer"],
        "shard": raw.get("shard"),
        "channels": index.channels,
        "pack_id": index.pack_id,
        "fields": {name: f.to_json() for name, f in index.fields.items()},
    }


def info_lines(info: dict[str, Any], *, max_classes: int = 12) -> list[str]:
    """``pack_info`` for people, a few lines."""
    h, w, c = info["shape"]
    heights, widths = info.get("record_heights", [h, h]), info.get("record_widths", [w, w])
    if heights == [h, h] and widths == [w, w] or not info["count"]:
        sizes = f"of {h}x{w}x{c}"
    else:
        sizes = (
            f"up to {h}x{w}x{c} (heights {heights[0]}..{heights[1]}, "
            f"widths {widths[0]}..{widths[1]})"
        )
    lines = [
        f"{Path(info['data_file']).name}: {info['count']} records {sizes} "
        f"{info['dtype']} ({info['layout']}), codec {info['codec']}, "
        f"{human_bytes(info['bytes'])}, format version {info['format_version']}"
    ]
    jpeg = info.get("jpeg")
    if jpeg:
        lines.append(_jpeg_line(jpeg, info["count"]))
    classes = info["classes"]
    if classes:
        shown = ", ".join(f"{k['name']} {k['count']}" for k in classes[:max_classes])
        more = f", ... {len(classes) - max_classes} more" if len(classes) > max_classes else ""
        lines.append(f"classes: {len(classes)} ({shown}{more})")
        lines.append(f"class list digest: {info['classes_digest']} (same digest, same classes)")
    if info["unlabelled"]:
        lines.append(f"unlabelled records: {info['unlabelled']}")
    lines.append(_fields_line(info))
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
        size = p["size"][0] if p.get("resize") == "fit" else f"{p['size'][0]}x{p['size'][1]}"
        lines.append(
            f"packed with: --size {size} --resize {p.get('resize')} "
            f"--filter {p.get('filter')} {_labels_options(p)}"
            + (f"--classes-from {p['classes_from']} " if p.get("classes_from") else "")
            + (f"--crop-ratio {p['crop_ratio']} " if p.get("crop_ratio", 1.0) != 1.0 else "")
            + (f"--channels {p['channels']} " if p.get("channels", 3) != 3 else "")
            + (f"--codec {p['codec']} " if p.get("codec", "raw") != "raw" else "")
            + (f"--quality {p['quality']} " if "quality" in p else "")
            + f"(imgpack {p.get('imgpack_version')}, Pillow {p.get('pillow')}, "
            f"source '{p.get('source')}')"
        )
    shard = info.get("shard")
    if shard and shard.get("count", 1) > 1:
        i, n = shard["index"], shard["count"]
        what = f"source {source_unit(p)}s"
        if shard.get("by") == "interleaved":
            held = f"{what} {i}, {i + n}, {i + 2 * n}, ..."
        else:
            a, b = shard.get("source_range", ["?", "?"])
            held = f"{what} {a}..{b}"
        lines.append(f"shard {i} of {n}: {held} of {shard['source_files']}")
    return lines


def _labels_options(p: dict[str, Any]) -> str:
    """How the pack's labels were chosen, as the options that choose them."""
    kind = p.get("source_kind")
    if kind == "parquet":
        return (
            f"--image-column {p.get('image_column')} "
            f"--label-column {p.get('label_column') or 'none'} "
        )
    if kind == "tar":
        key = p.get("label_key")
        unlabelled = p.get("labels") == "none"
        return ("--labels none " if unlabelled else "") + (f"--label-key {key} " if key else "")
    return f"--labels {p.get('labels_file') or p.get('labels')} "


def _jpeg_line(jpeg: dict[str, Any], count: int) -> str:
    """Quality and subsampling are the packer's encode settings: a record stored as it came
    is the source's own JPEG, with its own quality and subsampling."""
    setting = f"quality {jpeg['quality']}, {jpeg['subsampling']}"
    kept, encoded = jpeg["stored_as_is"], count - jpeg["stored_as_is"]
    if not kept:
        return f"jpeg: {setting} (every record encoded)"
    as_is = "the source's own JPEG, with its own quality and subsampling"
    if not encoded:
        return f"jpeg: every record stored as it came ({as_is}); none encoded at {setting}"
    s = "" if encoded == 1 else "s"
    return (
        f"jpeg: {setting} for the {encoded} record{s} encoded; "
        f"{kept} of {count} stored as they came ({as_is})"
    )


def _fields_line(info: dict[str, Any]) -> str:
    """Channels, geometry, target vectors and pack id in one line."""
    c = info["channels"]
    fields = info["fields"]
    geometry = all(f in fields for f in GEOMETRY_FIELDS)
    targets = fields.get("targets")
    parts = [
        f"channels: {c} ({'grayscale' if c == 1 else 'RGB'})",
        "geometry: per record" if geometry else "geometry: none (records are whole sources)",
        f"targets: {targets['shape'][0]} per record" if targets else "targets: none",
        f"pack id {info['pack_id']}",
    ]
    other = sorted(set(fields) - set(RECORD_FIELDS))
    if other:
        parts.append(f"other fields: {', '.join(other)}")
    return "; ".join(parts)
