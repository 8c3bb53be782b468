"""The sources benchmark as markdown: one row per kind, its ratio to the folder, the verdict."""

from __future__ import annotations

from typing import Any

__all__ = ["TARGET", "report"]

TARGET = 0.9  # issue 26: a tar or Parquet source packs at no less than 0.9x the folder


def report(result: dict[str, Any]) -> str:
    """A table for docs/benchmarks.md, the settings and the machine under it."""
    s, m = result["settings"], result["machine"]
    lines = [
        "| source | files | MB | median s | images/s | × folder (median) | × folder (min–max) "
        "| listing µs/sample | records |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['kind']} | {r['sources']} | {r['source_bytes'] / 1e6:,.1f} "
            f"| {r['median_s']:.2f} | {r['images_per_s']:,.0f} | {r['vs_folder']:.2f} "
            f"| {r['vs_folder_min']:.2f}–{r['vs_folder_max']:.2f} "
            f"| {1e6 * r['listing_s'] / s['images']:,.0f} "
            f"| {'identical' if r['records_equal'] else 'DIFFER'} |"
        )
    worst = min(r["vs_folder"] for r in result["rows"] if r["kind"] != "folder")
    verdict = "met" if worst >= TARGET else "MISSED"
    load = result["loadavg"]
    lines += [
        "",
        f"{s['images']} images, --size {s['size']}, {s['workers']} workers, {s['repeats']} "
        f"repeats (order rotated each repeat), {s['shards']} tar shards / Parquet files "
        f"({s['row_group']} rows a row group); warm page cache; {result['filesystem']}.",
        f"Machine: {m.get('cpu_model', '?')}, {m.get('usable_cpus', '?')} usable cores; "
        f"load average {load['start']} at the start, {load['end']} at the end.",
        f"Target: every source at >= {TARGET}x the folder's images/s: {verdict} "
        f"(worst median ratio {worst:.2f}).",
    ]
    return "\n".join(lines)
