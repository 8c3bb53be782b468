"""Markdown tables and the verdicts against issue 20's targets for ``run_jpeg_bench``'s result.

Targets (item 7 and item 3 of the issue): imgpack's decode at least 90% of a plain
simplejpeg loop per core, at least 85% scaling from 1 to 2 threads, delivery at least
1.5x FFCV's JPEG pipeline on the same records and threads, and the scale-aware decode
within 0.5 dB of the full decode's exact resample.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TARGETS", "verdict", "report"]

TARGETS = {"per_core": 0.90, "scaling": 0.85, "delivery": 1.5, "scaled_loss_db": 0.5}


def _fmt(v: Any, spec: str = ",.0f") -> str:
    return "-" if v is None else format(v, spec)


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    """Each target's measured value and whether it is met (None: not measured)."""
    out: dict[str, Any] = {}
    dec = {(r["decoder"], r["threads"]): r for r in result.get("decode", [])}
    # the reader's batch paths: a loader bound for a CUDA device decodes packed, any other
    # batch (a CPU device, a plain DataLoader) into the padded canvas
    for key, ours in (("", "imgpack decode_into"), ("_packed", "imgpack decode_into, packed")):
        if (ours, 1) in dec:
            per_core = dec[(ours, 1)]["vs_simplejpeg"]
            out[f"per_core{key}"] = {"value": per_core, "met": per_core >= TARGETS["per_core"]}
        if (ours, 2) in dec:
            scaling = dec[(ours, 2)]["scaling"]
            out[f"scaling{key}"] = {"value": scaling, "met": scaling >= TARGETS["scaling"]}
    for r in result.get("delivery", []):
        for key, ratio in (("", r["ratio"]), ("_packed", r["packed_ratio"])):
            out[f"delivery{key}_{r['threads']}"] = {"value": ratio,
                                                   "met": ratio >= TARGETS["delivery"]}  # fmt: skip
    # the reader's rule (jpeg.GAP, 1/2 at most); rows whose full decode is the truth itself
    # (records kept as they came) have no PSNR to lose to: their "scaled vs full" column is
    # the agreement
    used = [r for r in result.get("scaled", []) if r.get("rule") and r["full"] < 99]
    if used:
        worst = max(used, key=lambda r: r["loss_db"])
        out["scaled_loss_db"] = {
            "value": worst["loss_db"], "met": worst["loss_db"] <= TARGETS["scaled_loss_db"],
            "where": f"side {worst['side']} -> {worst['size']} {worst['kind']}",
        }  # fmt: skip
    return out


def _quality(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| storage | kept as-is | bytes/image | / FFCV's | ImageNet-1k GB | train PSNR | "
        "vs FFCV | eval PSNR | vs FFCV |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        name = f"{r['storage']} {r['side']}"
        if r["quality"] is not None:
            name += f" q{r['quality']} {r['subsampling']}"
        lines.append(
            f"| {name} | {r['as_is']} | {r['bytes']:,.0f} | {r['bytes_vs_ffcv']:.3f} | "
            f"{r['imagenet_gb']:.1f} | {r['train_psnr']:.2f} | {r['train_gain_db']:+.2f} | "
            f"{r['eval_psnr']:.2f} | {r['eval_gain_db']:+.2f} |"
        )
    return lines


def _scaled(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| record side | out | crops | margin | crops at 1/2/4/8 | pixels decoded | "
        "full-decode PSNR | scaled PSNR | loss dB | scaled vs full | DCT vs box | "
        "FFCV's rule PSNR |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        s = "/".join(str(v) for v in r["scales"].values())
        side = r["side"] if r["quality"] is None else f"{r['side']} q{r['quality']}"
        lines.append(
            f"| {side} | {r['size']} {r['kind']} | {r['crops']} | "
            f"{r['margin']:g}{' (reader)' * bool(r.get('rule'))} | "
            f"{s} | "
            f"{100 * r['pixels_decoded']:.0f}% | {r['full']:.2f} | {r['scaled']:.2f} | "
            f"{r['loss_db']:.2f} | {r['scaled_vs_full']:.2f} | {_fmt(r['dct_vs_box'], '.2f')} "
            f"| {r['ffcv_psnr']:.2f} |"
        )
    return lines


def _decode(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| decoder | threads | images/s (median pass) | per thread | scaling | / simplejpeg loop |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['decoder']} | {r['threads']} | {r['images_per_s']:,.0f} | "
            f"{r['per_thread']:,.0f} | {100 * r['scaling']:.0f}% | {r['vs_simplejpeg']:.2f} |"
        )
    return lines


def _delivery(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| threads | batch | out | imgpack images/s | FFCV pipeline images/s | ratio | "
        "imgpack bound for CUDA (packed) | ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['threads']} | {r['batch']} | {r['size']} | {r['imgpack_images_per_s']:,.0f} "
            f"| {r['ffcv_images_per_s']:,.0f} | {r['ratio']:.2f}x "
            f"| {r['packed_images_per_s']:,.0f} | {r['packed_ratio']:.2f}x |"
        )
    return lines


def report(result: dict[str, Any]) -> str:
    """Every table, the verdicts, and what ran (machine, load, code)."""
    m = result["machine"]
    out = [
        f"{result['photos']['images']} photographs; simplejpeg {result['simplejpeg']}; "
        f"load average {result['load_before'][0]:.2f} before, "
        f"{result.get('load_after', [0.0])[0]:.2f} after; {m.get('cpu_model', '')} "
        f"{m.get('usable_cpus', '')} usable CPUs",
        "",
    ]
    if result["quality"]:
        out += ["## (a) bytes/image and PSNR against the original", ""]
        out += _quality(result["quality"])
        out += ["", "### the scale-aware decode", "", *_scaled(result["scaled"]), ""]
    if result["decode"]:
        rec = result["records"]
        out += ["## (b) decode", "", f"records: a --resize fit --size {rec['side']} --codec jpeg "
                f"--quality {rec['quality']} pack of {rec['count']} ({rec['stored_as_is']} stored "
                f"as they came), {rec['bytes']:,.0f} B and {rec['pixels']:,.0f} pixels on average",
                "", *_decode(result["decode"]), ""]  # fmt: skip
    if result["delivery"]:
        d0 = result["delivery"][0]
        out += ["## (c) ready for the device transform", "",
                f"FFCV resize: {d0['ffcv_resize']}; imgpack decoded the crops at 1/2/4/8: "
                f"{'/'.join(str(v) for v in d0['scales'].values())}",
                "", *_delivery(result["delivery"]), ""]  # fmt: skip
    v = verdict(result)
    if v:
        out += ["## targets", ""]
        for name, t in v.items():
            mark = "met" if t["met"] else "NOT met"
            where = f" ({t['where']})" if "where" in t else ""
            out.append(f"* {name}: {t['value']:.2f}{where}: {mark}")
    return "\n".join(out)
