"""The loader-sweep plot that ``tune --plot`` draws.

matplotlib is optional (the ``plot`` extra) and imported only when a plot is asked
for, with the Agg backend so that it works on machines with no display.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.errors import MissingExtraError

__all__ = ["pyplot", "plot_sweep"]


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


def plot_sweep(measured: list[Any], path: str | os.PathLike, *, title: str) -> None:
    """Heatmap of images/s over loader kind x prefetch_factor, plus every config as a bar.

    ``measured``: ``advise.Measured`` of the configs that ran; those with a prefetch_factor
    land in the heatmap, in the row of their label without it (e.g. "workers=2", "in-process
    threads=1"), the best one where several share a cell (pin on and off).
    """
    plt = pyplot()
    grid = [m for m in measured if m.config.prefetch_factor]
    row = {id(m): m.config.label.split(" prefetch=")[0] for m in grid}
    rows = list(dict.fromkeys(row.values()))
    cols = sorted({m.config.prefetch_factor for m in grid})
    fig, (ax_h, ax_b) = plt.subplots(1, 2, figsize=(13, max(4.0, 0.32 * len(measured) + 1.5)))
    if grid:
        cells = np.full((len(rows), len(cols)), np.nan)
        for m in grid:
            i, j = rows.index(row[id(m)]), cols.index(m.config.prefetch_factor)
            cells[i, j] = np.fmax(cells[i, j], m.rates.median)
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
    y = np.arange(len(measured))
    med = np.array([m.rates.median for m in measured], dtype=float)
    err = np.array([[m.rates.median - m.rates.min, m.rates.max - m.rates.median] for m in measured])
    ax_b.barh(y, med, xerr=err.T if len(measured) else None, color="tab:blue", capsize=3)
    ax_b.set_yticks(y, [m.config.label for m in measured], fontsize=8)
    ax_b.invert_yaxis()
    ax_b.set_xlabel("images/s (median, bars min–max)")
    fig.suptitle(title)
    fig.tight_layout()
    tmp = Path(path).with_name(f".{Path(path).name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
