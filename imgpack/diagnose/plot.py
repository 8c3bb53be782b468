"""The loader-sweep plot that ``tune --plot`` draws: images/s per configuration.

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
    """Every config that ran (``advise.Measured``) as a bar: images/s, median, with the
    min-max of its repeats, in the order of the table ``tune`` prints."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, max(3.0, 0.32 * len(measured) + 1.5)))
    y = np.arange(len(measured))
    med = np.array([m.rates.median for m in measured], dtype=float)
    err = np.array([[m.rates.median - m.rates.min, m.rates.max - m.rates.median] for m in measured])
    ax.barh(y, med, xerr=err.T if len(measured) else None, color="tab:blue", capsize=3)
    ax.set_yticks(y, [m.config.label for m in measured], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("images/s (median, bars min–max)")
    ax.set_title(title)
    fig.tight_layout()
    tmp = Path(path).with_name(f".{Path(path).name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
