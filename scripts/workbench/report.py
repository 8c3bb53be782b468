"""Reporting for the load benchmark: machine facts, ratios, a markdown table, JSON lines.

The sweep plot is shared with ``tune`` and lives in ``imgpack.diagnose.plot``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from imgpack.machine import machine_facts

__all__ = ["machine_info", "add_ratios", "markdown_table", "write_jsonl", "run_reported"]


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


def run_reported(
    name: str,
    run: Callable[..., dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
    work: Path | None,
    out: Path | None,
    **kw: Any,
) -> None:
    """A fidelity bench's CLI body: ``run(folder, **kw)`` in ``work`` (default: a temporary
    folder), its markdown report on stdout, the result as JSON to ``out`` (atomically); an
    imgpack error is one line on stderr and exit 1."""
    from imgpack.errors import ImgpackError

    try:
        if work is None:
            with tempfile.TemporaryDirectory() as tmp:
                result = run(tmp, **kw)
        else:
            work.mkdir(parents=True, exist_ok=True)
            result = run(work, **kw)
    except ImgpackError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        sys.exit(1)
    print(report(result))
    if out is not None:
        tmp_out = out.with_name(f".{out.name}.tmp")
        tmp_out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp_out, out)
