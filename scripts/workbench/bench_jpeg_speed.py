"""Decode speed (issue 20, table b) and images/s ready for the device transform (table c).

Both tables run on one set of records, ``Records``: the JPEG bytes of a pack (or, before
the packer writes jpeg packs, the bytes ``--codec jpeg`` would store: sources kept as
they came, the rest encoded by Pillow), their sizes and their source geometry.

(b) decode: every record decoded once per pass, passes alternated between the
    decoders and repeated, the median pass reported. "imgpack" is ``reader_jpeg().decode``
    on ``reader_pool()`` threads (1 thread: a plain loop in the caller); "simplejpeg" is the
    plain loop the issue compares with (2 threads: two plain loops over the two halves);
    "Pillow" is the same loop with ``Image.open(...).convert("RGB")``.
(c) delivery: an epoch of batches, the same RandomResizedCrop boxes on both sides
    (drawn once per epoch in source pixels, mapped into each record). "imgpack" decodes
    each record at ``pick_scale(box, out)`` into a uint8 canvas of the batch's largest
    decoded size, zeros beyond each record, and hands the boxes in decoded pixels on: what
    ``DeviceTransform.train`` resamples on the device. "FFCV" is FFCV's JPEG pipeline on
    the CPU: full-size libjpeg-turbo decode (simplejpeg), the box rounded to whole pixels,
    ``cv2.resize(..., INTER_AREA)`` to out x out into the batch (Pillow's BOX filter where
    OpenCV is not installed, and the row says so). Same threads, same pool on both sides.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from imgpack.reader.augment import Geometry, random_resized_boxes, to_record
from workbench.bench_augment import RATIO, SCALE
from workbench.jpeg_decoders import (
    StandinPool,
    pillow_decode,
    plain_decode,
    reader_jpeg,
    reader_pool,
    to_decoded,
)

__all__ = ["Records", "code_tag", "decode_table", "delivery_table", "ffcv_resize"]


@dataclass
class Records:
    """JPEG records and where they came from (the geometry draws the crop boxes)."""

    bufs: list[bytes]
    sizes: np.ndarray  # (N, 2) int (w, h)
    geometry: Geometry  # float64 source sizes/boxes, content boxes, of all N records
    origin: str  # "pack <path>" or "encoded as --codec jpeg would (no jpeg pack yet)"


def code_tag(jpeg: Any, real_pool: bool) -> str:
    """Which code the "imgpack" rows ran: the reader's own, or (part) stand-in."""
    ours = jpeg.__name__.startswith("imgpack")
    if ours and real_pool:
        return "imgpack (imgpack.reader.jpeg, imgpack.reader.decodepool)"
    return (f"STAND-IN: decode from {'imgpack' if ours else 'workbench'}, "
            f"pool from {'imgpack' if real_pool else 'workbench'}")  # fmt: skip


def _median_passes(fns: dict[Any, Callable[[], Any]], repeats: int) -> dict[Any, list[float]]:
    """Seconds per call of each fn, alternated round by round after one warm-up each."""
    for fn in fns.values():
        fn()
    times: dict[Any, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def _halves(decode: Callable[[bytes], Any], bufs: list[bytes], threads: int, pool):
    """``threads`` plain loops, each over its own contiguous share of the records."""
    bounds = np.linspace(0, len(bufs), threads + 1).astype(int)

    def loop(t: int) -> None:
        for b in bufs[bounds[t] : bounds[t + 1]]:
            decode(b)

    return lambda: pool.run(threads, loop, threads)


def decode_table(rec: Records, threads: tuple[int, ...], repeats: int) -> list[dict[str, Any]]:
    """One row per decoder and thread count: images/s (median pass), per core, scaling."""
    jpeg, (pool, real_pool) = reader_jpeg(), reader_pool()
    plain_pool = StandinPool()
    n, sizes = len(rec.bufs), rec.sizes
    fns: dict[tuple[str, int], Callable[[], Any]] = {}

    def ours(i: int) -> None:
        jpeg.decode(rec.bufs[i], int(sizes[i, 0]), int(sizes[i, 1]), 3, where=f"record {i}")

    for t in threads:
        fns[("imgpack", t)] = lambda t=t: pool.run(n, ours, t)
        fns[("simplejpeg loop", t)] = _halves(plain_decode, rec.bufs, t, plain_pool)
        fns[("Pillow loop", t)] = _halves(pillow_decode, rec.bufs, t, plain_pool)
    try:
        times = _median_passes(fns, repeats)
    finally:
        plain_pool.close()
    rate = {k: n / statistics.median(v) for k, v in times.items()}
    rows = []
    for (name, t), r in rate.items():
        one = rate[(name, threads[0])] * t / threads[0]
        rows.append({"decoder": name, "threads": t, "images_per_s": r,
                     "per_thread": r / t, "scaling": r / one,
                     "vs_simplejpeg": r / rate[("simplejpeg loop", t)],
                     "samples_s": times[(name, t)]})  # fmt: skip
    tag = code_tag(jpeg, real_pool)
    for r in rows:
        r["imgpack_code"] = tag
    return rows


def ffcv_resize() -> tuple[Callable[[np.ndarray, int], np.ndarray], str]:
    """FFCV's CPU resize of a crop (OpenCV INTER_AREA, one thread per call), or Pillow's BOX."""
    try:
        import cv2
    except ImportError:
        return (lambda a, n: np.asarray(Image.fromarray(a).resize((n, n), Image.BOX)),
                "Pillow BOX (OpenCV is not installed: not FFCV's own resize)")  # fmt: skip
    cv2.setNumThreads(1)  # the benchmark's threads are the parallelism, as on imgpack's side
    return (lambda a, n: cv2.resize(a, (n, n), interpolation=cv2.INTER_AREA),
            f"cv2.resize INTER_AREA (OpenCV {cv2.__version__})")  # fmt: skip


def _epoch_boxes(rec: Records, batch: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(indices, record-pixel boxes) per batch of one shuffled epoch."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(rec.bufs), generator=gen).numpy()
    out = []
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        g = Geometry(*(t[idx] for t in rec.geometry[:3]))
        boxes = to_record(random_resized_boxes(g.source_boxes, SCALE, RATIO, gen), g)
        out.append((idx, boxes.numpy()))
    return out


def _imgpack_batch(rec: Records, idx, boxes, size: int, threads: int, jpeg, pool):
    """The batch at crop scale: uint8 (B, h, w, 3) canvas and the boxes in decoded pixels."""
    sizes = rec.sizes
    bw, bh = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    scales = np.array([jpeg.pick_scale(float(w), float(h), size, size) for w, h in zip(bw, bh)])
    dec = [jpeg.scaled_size(int(sizes[i, 0]), int(sizes[i, 1]), int(d))
           for i, d in zip(idx, scales)]  # fmt: skip
    canvas = np.empty((len(idx), max(h for _, h in dec), max(w for w, _ in dec), 3), np.uint8)

    def one(k: int) -> None:
        i, (w, h) = idx[k], dec[k]
        img = jpeg.decode(rec.bufs[i], int(sizes[i, 0]), int(sizes[i, 1]), 3,
                          scale=int(scales[k]), where=f"record {i}")  # fmt: skip
        canvas[k, :h, :w] = img
        canvas[k, h:] = 0
        canvas[k, :h, w:] = 0

    pool.run(len(idx), one, threads)
    return torch.from_numpy(canvas), to_decoded(boxes, scales)


def _ffcv_batch(rec: Records, idx, boxes, size: int, threads: int, resize, pool):
    """FFCV's batch: each record decoded whole, its integer box resized to size x size."""
    out = np.empty((len(idx), size, size, 3), dtype=np.uint8)
    ints = np.rint(boxes).astype(np.int64)

    def one(k: int) -> None:
        img = plain_decode(rec.bufs[idx[k]])
        x0, y0, x1, y1 = ints[k]
        out[k] = resize(img[y0 : max(y1, y0 + 1), x0 : max(x1, x0 + 1)], size)

    pool.run(len(idx), one, threads)
    return torch.from_numpy(out)


def delivery_table(rec: Records, threads: tuple[int, ...], batch: int, size: int, epochs: int,
                   seed: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """images/s delivered by each side per thread count (median epoch), and their ratio."""
    jpeg, (pool, real_pool) = reader_jpeg(), reader_pool()
    ffcv_pool = StandinPool()
    resize, resize_name = ffcv_resize()
    plan = _epoch_boxes(rec, batch, seed)
    fns = {}
    for t in threads:
        fns[("imgpack", t)] = lambda t=t: [
            _imgpack_batch(rec, idx, b, size, t, jpeg, pool) for idx, b in plan
        ]
        fns[("FFCV", t)] = lambda t=t: [
            _ffcv_batch(rec, idx, b, size, t, resize, ffcv_pool) for idx, b in plan
        ]
    try:
        times = _median_passes(fns, epochs)
    finally:
        ffcv_pool.close()
    n = len(rec.bufs)
    boxes = np.concatenate([b for _, b in plan])
    picked = [jpeg.pick_scale(float(b[2] - b[0]), float(b[3] - b[1]), size, size) for b in boxes]
    scales = {str(d): int(np.sum(np.array(picked) == d)) for d in jpeg.SCALES}
    tag = code_tag(jpeg, real_pool)
    rows = []
    for t in threads:
        ours = n / statistics.median(times[("imgpack", t)])
        theirs = n / statistics.median(times[("FFCV", t)])
        rows.append({"threads": t, "batch": batch, "size": size, "imgpack_images_per_s": ours,
                     "ffcv_images_per_s": theirs, "ratio": ours / theirs,
                     "ffcv_resize": resize_name, "imgpack_code": tag, "scales": scales,
                     "imgpack_samples_s": times[("imgpack", t)],
                     "ffcv_samples_s": times[("FFCV", t)]})  # fmt: skip
    return rows
