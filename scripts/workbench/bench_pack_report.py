"""Reporting for the packing benchmark: machine facts, ratios, targets, markdown, JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import PIL
from PIL import features

from imgpack import __version__
from imgpack.machine import machine_facts as base_machine_facts

__all__ = [
    "FOLDERS",
    "NOTES",
    "TARGETS",
    "machine_facts",
    "loadavg",
    "filesystem",
    "add_ratios",
    "targets",
    "markdown_report",
    "write_json",
]

FOLDERS = ("imagenet-like", "large")  # the two sample folders, in the order they run

# (folder, measure, goal): "per_core" = a pack row's images/s per worker over the naive
# loop's; "efficiency_2" = (images/s at 2 workers / 2) / images/s at 1 worker.
TARGETS = (
    ("imagenet-like", "per_core", 1.0),
    ("large", "per_core", 3.0),
    ("imagenet-like", "efficiency_2", 0.85),
    ("large", "efficiency_2", 0.85),
)

# How every run measures, recorded with the numbers.
NOTES = {
    "page_cache": "warm: every source file read once before timing",
    "naive": "Image.open, convert('RGB'), bilinear resize of the shorter side to size, "
    "centre crop, tobytes; full decode, no draft, no reducing_gap",
    "output": "every row writes its pixels to one file and fsyncs it "
    "(pack rows: pack_folder's own .bin and .json)",
    "ablation": "pack_folder takes no draft/reducing_gap, so these are decode_image "
    "loops in one process with DecodeSettings variants",
}


def machine_facts() -> dict[str, Any]:
    """What the numbers depend on: CPU, cores, library versions, libjpeg-turbo."""
    return {
        **base_machine_facts(),
        "pillow": PIL.__version__,
        "numpy": np.__version__,
        "libjpeg_turbo": bool(features.check_feature("libjpeg_turbo")),
        "imgpack": __version__,
        "loadavg_start": loadavg(),
    }


def filesystem(path: str | os.PathLike) -> str | None:
    """The type of the filesystem holding ``path`` (tmpfs writes never reach a disk)."""
    path, best, kind = os.path.realpath(path), "", None
    try:
        with open("/proc/mounts", encoding="utf-8", errors="replace") as f:
            for line in f:
                _, mount, fstype, *_ = line.split()
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, fstype
    except OSError:
        return None
    return kind


def loadavg() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """× naive, per core × naive, and 1 -> N scaling efficiency for the pack rows."""
    for name in FOLDERS:
        mine = [r for r in rows if r["folder"] == name]
        naive = next(r["images_per_s"] for r in mine if r["row"] == "naive")
        one = next(r["images_per_s"] for r in mine if r["row"] == "pack" and r["workers"] == 1)
        for r in mine:
            r["x_naive"] = round(r["images_per_s"] / naive, 3)
            r["per_core_x_naive"] = round(r["images_per_s"] / r["workers"] / naive, 3)
            if r["row"] == "pack":
                r["efficiency"] = round(r["images_per_s"] / r["workers"] / one, 3)


def targets(rows: list[dict[str, Any]], workers: list[int]) -> list[dict[str, Any]]:
    """The issue's goals, each with the measured value and whether it is met.

    Per-core goals are checked at 1 worker and at the most workers measured.
    """
    pack = {(r["folder"], r["workers"]): r for r in rows if r["row"] == "pack"}
    out = []
    for name, what, goal in TARGETS:
        if what == "per_core":
            for w in sorted({1, max(workers)}):
                value = pack[(name, w)]["per_core_x_naive"]
                text = f"{name}: pack-images per core at {w} worker{'s' * (w > 1)} vs naive"
                out.append({"target": text, "value": value, "goal": goal, "met": value >= goal})
        else:
            value = pack[(name, 2)]["efficiency"] if (name, 2) in pack else None
            out.append(
                {
                    "target": f"{name}: scaling efficiency 1 -> 2 workers",
                    "value": value,
                    "goal": goal,
                    "met": None if value is None else value >= goal,
                }
            )
    return out


def markdown_report(result: dict[str, Any]) -> str:
    """The result as markdown ready for docs/benchmarks.md: context, rows, targets."""
    m, s = result["machine"], result["settings"]
    turbo = "libjpeg-turbo" if m["libjpeg_turbo"] else "no libjpeg-turbo"
    lines = [
        f"{m['cpu_model']}, {m['usable_cpus']} usable cores; Python {m['python']}, "
        f"Pillow {m['pillow']} ({turbo}), numpy {m['numpy']}; load average "
        f"{m['loadavg_start']} at start.",
        "",
        f"Command: `{result['command'] or 'run_pack_benchmark()'}`. Output {s['size']}x{s['size']}"
        f" center-crop; median of {s['repeats']} repeats; page cache warm (every source file read"
        " once before timing). Naive: full decode, convert('RGB'), bilinear resize of the shorter"
        " side, centre crop. Every row writes its pixels to one file and fsyncs it. The draft and"
        " reducing_gap rows time decode_image in one process (pack_folder does not take them).",
        "",
    ]
    for name, f in result["folders"].items():
        same = "yes" if f["identical_across_workers"] else "NO"
        lines.append(
            f"- {name}: {f['images']} JPEGs, {f['bytes'] / 1e6:.1f} MB, mean "
            f"{f['mean_size'][0]}x{f['mean_size'][1]}, shortest side {f['min_short_side']}; "
            f"packs identical across worker counts: {same}"
            f"; mean |pack - naive| {f['pack_mean_abs_diff_vs_naive']} levels"
        )
    lines += [
        "",
        "| folder | measurement | workers | images/s (median) | min–max | × naive "
        "| per core × naive | efficiency vs 1 worker |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        eff = f"{100 * r['efficiency']:.0f}%" if "efficiency" in r else "–"
        lines.append(
            f"| {r['folder']} | {r['label']} | {r['workers']} | {r['images_per_s']:,.1f} "
            f"| {r['min']:,.1f}–{r['max']:,.1f} | {r['x_naive']:.2f}× "
            f"| {r['per_core_x_naive']:.2f}× | {eff} |"
        )
    lines += ["", "| target | measured | goal | met |", "|---|---:|---:|---|"]
    for t in result["targets"]:
        value = "–" if t["value"] is None else f"{t['value']:.2f}"
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {value} | {t['goal']:.2f} | {met} |")
    return "\n".join(lines)


def write_json(path: str | os.PathLike, result: dict[str, Any]) -> None:
    """Write ``result`` beside the target, then rename it into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
