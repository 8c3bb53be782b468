"""Reporting for bench and tune: machine facts, ratios, a markdown table, JSON lines, a plot.

matplotlib is optional (the ``plot`` extra) and imported only when a plot is asked
for, with the Agg backend so that it works on machines with no display.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.errors import MissingExtraError
from imgpack.machine import machine_facts

__all__ = ["machine_info", "add_ratios", "markdown_table", "write_jsonl", "pyplot", "plot_sweep"]


def machine_info() -> dict[str, Any]:
    import torch

    return {
        **machine_facts(),
        "processor": platform.processor() or platform.machine(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
    }


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Give every row its median as a multiple of the baseline and as a share of memcpy."""
    ref = {r["row"]: r["images_per_s"] for r in rows if r["row"] in ("baseline", "memcpy")}
    for r in rows:
        if "images_per_s" not in r:
            continue
        if ref.get("baseline"):
            r["vs_baseline"] = round(r["images_per_s"] / ref["baseline"], 2)
        if ref.get("memcpy"):
            r["vs_memcpy"] = round(r["images_per_s"] / ref["memcpy"], 4)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a table ready to paste into docs/benchmarks.md."""
    lines = [
        "| measurement | cache | images/s (median) | min–max | × baseline | % of memcpy |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "images_per_s" not in r:
            continue
        xb = f"{r['vs_baseline']:,.1f}×" if "vs_baseline" in r else "–"
        pm = f"{100 * r['vs_memcpy']:.1f}%" if "vs_memcpy" in r else "–"
        lines.append(
            f"| {r['label']} | {r['cache']} | {r['images_per_s']:,.0f} "
            f"| {r['min']:,.0f}–{r['max']:,.0f} | {xb} | {pm} |"
        )
    return "\n".join(lines)


def write_jsonl(path: str | os.PathLike, rows: list[dict[str, Any]]) -> None:
    """One JSON object per line, written beside the target then renamed into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


def pyplot():
    """matplotlib.pyplot on the Agg backend, or a clear error when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtraError(
            "plotting needs matplotlib, which is not installed (pip install imgpack[plot])"
        ) from None
    return plt


def plot_sweep(points: list[dict[str, Any]], path: str | os.PathLike, *, title: str) -> None:
    """Heatmap of images/s over loader kind x prefetch_factor, plus every config as a bar.

    ``points``: dicts with label, images_per_s, min, max, and optionally ``row``
    (e.g. "2 workers", "in-process") and ``prefetch_factor``; points with both
    land in the heatmap (the best one where several share a cell, e.g. pin on/off).
    """
    plt = pyplot()
    grid = [p for p in points if p.get("row") and p.get("prefetch_factor")]
    rows = list(dict.fromkeys(p["row"] for p in grid))
    cols = sorted({p["prefetch_factor"] for p in grid})
    fig, (ax_h, ax_b) = plt.subplots(1, 2, figsize=(13, max(4.0, 0.32 * len(points) + 1.5)))
    if grid:
        cells = np.full((len(rows), len(cols)), np.nan)
        for p in grid:
            i, j = rows.index(p["row"]), cols.index(p["prefetch_factor"])
            cells[i, j] = np.fmax(cells[i, j], p["images_per_s"])
        im = ax_h.imshow(cells, cmap="viridis", origin="lower", aspect="auto")
        mid = (np.nanmin(cells) + np.nanmax(cells)) / 2
        for (i, j), v in np.ndenumerate(cells):
            if not np.isnan(v):
                ink = "k" if v > mid else "w"  # readable on viridis's light and dark ends
                ax_h.text(j, i, f"{v:,.0f}", ha="center", va="center", color=ink, fontsize=9)
        ax_h.set_xticks(range(len(cols)), [str(c) for c in cols])
        ax_h.set_yticks(range(len(rows)), rows)
        fig.colorbar(im, ax=ax_h, label="images/s (median)")
    ax_h.set_xlabel("prefetch_factor (batches ahead per worker / per thread)")
    ax_h.set_title("images/s by loader and prefetch_factor")
    y = np.arange(len(points))
    med = np.array([p["images_per_s"] for p in points], dtype=float)
    err = np.array([[m - p["min"], p["max"] - m] for p, m in zip(points, med)]).T
    ax_b.barh(y, med, xerr=err if len(points) else None, color="tab:blue", capsize=3)
    ax_b.set_yticks(y, [p["label"] for p in points], fontsize=8)
    ax_b.invert_yaxis()
    ax_b.set_xlabel("images/s (median, bars min–max)")
    fig.suptitle(title)
    fig.tight_layout()
    tmp = Path(path).with_name(f".{Path(path).name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
