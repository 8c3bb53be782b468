"""The markdown table and the verdict per gap for ``run_scaled_bench``'s result.

The verdict of a gap: every colour crop it decodes at 1/2 stays within 0.5 dB of the full
decode's exact resample, except where the loader's own full decode misses 0.5 dB on that
crop too (the measure's floor: the truth and Pillow's resample of the full decode are both
rounded to uint8 and round alike). Grey crops are counted beside it, not judged: nothing
known before decoding tells a grey record from a colour one (``imgpack.reader.jpeg``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["verdict", "table", "bytes_per_pixel", "report"]

_NAMES = {"camera": "camera", "imagenet": "ImageNet-sized"}


def _label(r: dict[str, Any], qualities: int) -> str:
    name = _NAMES.get(r["set"], r["set"])
    if not r["set"].endswith("to L"):
        name += f" {r['photos']}"
    return name + (f" q{r['quality']}" if qualities > 1 else "")


def _loss(worst: float | None, over: int) -> str:
    return "-" if worst is None else f"{worst:+.2f} ({over})"


def verdict(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per gap (key ``f"{gap:g}"``): colour crops at 1/2, how many lose over 0.5 dB, the
    misses the floor does not explain and the worst of them, grey crops at 1/2 and over,
    the share of pixels decoded pooled over every colour crop, and ``met`` (no miss)."""
    q = len(result["config"]["qualities"])
    out = {}
    for gap in result["config"]["gaps"]:
        rows = [r for r in result["rows"] if r["gap"] == gap]
        colour = [r for r in rows if r["photos"] == "colour"]
        grey = [r for r in rows if r["photos"] == "grey"]
        missed = [r for r in colour if r["misses"]]
        # the worst crop the floor does not explain, not the row's worst (which may be a crop
        # whose full decode misses too); rows written before worst_miss_db: the row's worst
        worst = max(missed, key=lambda r: r.get("worst_miss_db", r["loss_db"]), default=None)
        pixels = sum(r["pixels"] for r in colour)
        out[f"{gap:g}"] = {
            "colour_at_half": sum(r["at_half"] for r in colour),
            "colour_over": sum(r["over"] for r in colour),
            "misses": sum(r["misses"] for r in colour),
            "worst_miss": None if worst is None else {
                "where": f"{_label(worst, q)} -> {worst['out']}",
                "loss_db": worst.get("worst_miss_db", worst["loss_db"]),
                "full_loss_db": worst.get("worst_miss_full_db", worst["full_loss_db"])},
            "grey_at_half": sum(r["at_half"] for r in grey),
            "grey_over": sum(r["over"] for r in grey),
            "pixels_decoded": sum(r["pixels_decoded"] * r["pixels"] for r in colour) / pixels
            if pixels else 1.0,
            "met": not missed,
        }  # fmt: skip
    return out


def table(result: dict[str, Any]) -> list[str]:
    """One row per set, photos and output where some gap decodes a crop at 1/2; per gap:
    crops at 1/2, worst 1/2 loss (crops over 0.5 dB), the full decode's on the same crops,
    the share of pixels decoded."""
    gaps, q = result["config"]["gaps"], len(result["config"]["qualities"])
    head = "| records | out | crops |"
    rule = "|---|---:|---:|"
    for g in gaps:
        head += f" {g:g}: at 1/2 | 1/2 loss | full decode | pixels |"
        rule += "---:|---:|---:|---:|"
    lines = [head, rule]
    by_key: dict[tuple, dict[float, dict[str, Any]]] = {}
    for r in result["rows"]:
        by_key.setdefault((r["set"], r["quality"], r["photos"], r["out"]), {})[r["gap"]] = r
    left_out = 0
    for per_gap in by_key.values():
        first = per_gap[gaps[0]]
        if not any(r["at_half"] for r in per_gap.values()):
            left_out += 1
            continue
        line = f"| {_label(first, q)} | {first['out']} | {first['crops']} |"
        for g in gaps:
            r = per_gap[g]
            line += (f" {r['at_half']} | {_loss(r['loss_db'], r['over'])} | "
                     f"{_loss(r['full_loss_db'], r['full_over'])} | "
                     f"{100 * r['pixels_decoded']:.0f}% |")  # fmt: skip
        lines.append(line)
    lines += ["", f"({left_out} set/output rows with no crop at 1/2 at any gap are left out.)"]
    return lines


def bytes_per_pixel(result: dict[str, Any]) -> list[str]:
    """Per set and quality, the range of the records' compressed bytes per pixel: those with
    a crop at 1/2 over 0.5 dB, and those whose crops at 1/2 all stay within it (whether a
    record's size could tell the ones that lose; crops at 1/2 by the smallest gap)."""
    limit, records = result["config"]["limit_db"], {}
    for c in result["crops"]:
        key = (c["set"], c["quality"], c["file"])
        lost = records.get(key, (False, 0.0))[0] or c["loss_db"] > limit
        records[key] = (lost, c["bytes_per_pixel"])
    spans: dict[tuple, dict[bool, list[float]]] = {}
    for (name, q, _), (lost, bpp) in records.items():
        spans.setdefault((name, q), {True: [], False: []})[lost].append(bpp)

    def span(v: list[float]) -> str:
        return f"{min(v):.3f}-{max(v):.3f} ({len(v)})" if v else "-"

    lines = ["| records | quality | bytes/pixel, over 0.5 dB | within |", "|---|---:|---|---|"]
    for (name, q), by in spans.items():
        lines.append(f"| {_NAMES.get(name, name)} | {q} | {span(by[True])} | {span(by[False])} |")
    return lines


def report(result: dict[str, Any]) -> str:
    """What ran, the table, and the verdict per gap."""
    m, cfg = result["machine"], result["config"]
    sets = ", ".join(
        f"{_NAMES.get(s['name'], s['name'])} {s['photos']} ({s['grey']} grey, "
        f"{s['crops_per_photo']} train crops + eval)"
        for s in result["sets"]
    )
    out = [
        f"sets: {sets}; qualities {cfg['qualities']}; outputs {cfg['outs']}; "
        f"simplejpeg {result['simplejpeg']}; {m.get('cpu_model', '')} "
        f"{m.get('usable_cpus', '')} usable CPUs; load average {result['load_before'][0]:.2f} "
        f"before, {result['load_after'][0]:.2f} after; {result['seconds']:.0f} s",
        "",
        *table(result),
        "",
        *bytes_per_pixel(result),
        "",
        "## verdict per gap: every colour crop within 0.5 dB, except where the full decode "
        "misses too",
        "",
    ]
    for gap, v in verdict(result).items():
        line = (
            f"* gap {gap}: {v['colour_at_half']} colour crops at 1/2, {v['colour_over']} over "
            f"{cfg['limit_db']} dB, {v['misses']} of them with the full decode within it"
        )
        if v["worst_miss"]:
            w = v["worst_miss"]
            line += (
                f" (worst {w['loss_db']:+.2f} dB, full decode {w['full_loss_db']:+.2f}, "
                f"{w['where']})"
            )
        line += (
            f"; grey: {v['grey_at_half']} at 1/2, {v['grey_over']} over; colour pixels "
            f"decoded {100 * v['pixels_decoded']:.0f}%: {'met' if v['met'] else 'NOT met'}"
        )
        out.append(line)
    return "\n".join(out)
