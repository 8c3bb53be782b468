"""The markdown tables of ``run_cpu_kernels``'s result, with the issue's targets beside them.

Targets (issue 28): yuv420 to RGB at a third (target: a half) of the raw copy's images/s at
the same threads; the CPU crop path at 1.0x (target 1.5x) FFCV's, within 0.5 dB of the
exact resample of the record on every crop.
"""

from __future__ import annotations

from typing import Any

__all__ = ["yuv_markdown", "candidates_markdown", "path_markdown", "normalise_markdown",
           "report"]  # fmt: skip


def yuv_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| side | threads | images/s | x raw copy | ns/pixel (CPU) | x RGB copy | "
             "per-thread scaling |", "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['side']} | {r['threads']} | {r['images_per_s']:,.0f} | "
                     f"{r['vs_raw_copy']:.2f} | {r['ns_per_pixel']:.2f} | {r['vs_rgb_copy']:.1f} | "
                     f"{r['scaling']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def candidates_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| crops | resampler | us/crop | x FFCV's resize | worst dB lost | mean dB lost | "
             "crops over 0.5 dB | PSNR vs exact |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['kind']} ({r['crops']}) | {r['candidate']} | {r['us_per_crop']:,.0f} | "
                     f"{r['vs_ffcv']:.2f} | {r['worst_db']:+.2f} | {r['mean_db']:+.3f} | "
                     f"{r['over']} | {r['psnr_vs_exact']:.1f} |")  # fmt: skip
    return "\n".join(lines)


def path_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| crops | threads | imgpack images/s | FFCV images/s | imgpack / FFCV | "
             "imgpack + normalise | today (canvas + DeviceTransform.apply) |",
             "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['kind']} | {r['threads']} | {r['imgpack_images_per_s']:,.0f} | "
                     f"{r['ffcv_images_per_s']:,.0f} | {r['ratio']:.2f}x | "
                     f"{r['normalised_images_per_s']:,.0f} | "
                     f"{r['today_images_per_s']:,.0f} |")  # fmt: skip
    return "\n".join(lines)


def normalise_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| as | into | torch threads | us/image |", "|---|---|---:|---:|"]
    lines += [f"| {r['method']} | {r['dtype']} | {r['threads']} | {r['us_per_image']:.1f} |"
              for r in rows]  # fmt: skip
    return "\n".join(lines)


def report(result: dict[str, Any]) -> str:
    """Every table, titled, with the machine's load before and after."""
    cfg = result["config"]
    return "\n\n".join([
        f"machine: {result['machine'].get('cpu_model')}, {result['machine'].get('usable_cpus')} "
        f"usable CPUs; load average before {result['load_before'][0]:.2f}, "
        f"after {result['load_after'][0]:.2f}",
        f"(a) yuv420 (fit {cfg['yuv_side']}) to RGB beside copying raw (fit {cfg['raw_side']}) "
        f"records, {cfg['photos']} photographs, batch {cfg['batch']}",
        yuv_markdown(result["yuv"]),
        f"(b) crop resamplers, {cfg['size']} px out of fit {cfg['jpeg_side']} q{cfg['quality']} "
        "JPEG records, one thread",
        candidates_markdown(result["candidates"]),
        f"(c) decode + crop + resize + flip into a (B, {cfg['size']}, {cfg['size']}, 3) batch",
        path_markdown(result["path"]),
        "(d) the per-batch normalise",
        normalise_markdown(result["normalise"]),
    ])  # fmt: skip
