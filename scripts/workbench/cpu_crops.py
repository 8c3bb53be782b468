"""Tables (b) and (c) of the CPU kernels' benchmark: the per-record crop, alone and in the path.

Both run on one ``--resize fit --size S --codec jpeg --quality Q`` pack made by the packer,
over the crops ``DeviceTransform.train(ds, size)`` and ``.eval(ds, size)`` draw
(``imgpack.reader.plan.Scaled``, which also picks each record's DCT scale).

(b) each candidate resampler (``workbench.cpu_candidates``) on every crop of the records as
    ``ds[i]`` decodes them, one thread, alternated over repeats (median), and its fidelity:
    per crop, how much closer to the photograph the exact resample of the record (Pillow's
    of the whole record) is than the candidate (dB; the truth is Pillow's resample of the
    source file over the source box, as in ``tests/reader/test_augment_v3.py``; the exact
    resample's own PSNR capped at 50 dB), and its PSNR against that exact resample.
(c) the whole CPU crop path, per batch into a (B, size, size, 3) uint8 batch, on t threads
    (``LoopPool``): "imgpack" decodes each record with ``imgpack.reader.jpeg.decode`` at
    the scale the plan picked into its thread's buffer and calls ``resample_record`` with
    the plan's box and flip into the batch slot; "FFCV" decodes each record whole into its
    thread's buffer (simplejpeg, with the fast DCT FFCV's ``imdecode`` asks libjpeg-turbo for),
    resizes the box rounded to whole pixels with OpenCV's INTER_AREA into the slot, flipping
    as a stage of its own. Beside them, to the float
    batch: "imgpack + normalise" (``imgpack.reader.transform.normalise`` after the crops) and
    "today" (the records decoded into a canvas by ``ds.decode_into``, then
    ``DeviceTransform.apply`` of the same plan on the CPU, torch's threads set to t).
(d) the normalise done once per batch after (c): x * scale + shift into a channels_last
    float tensor, as ``DeviceTransform`` writes it and as ``imgpack.reader.transform.normalise``
    does, on torch's threads.
"""

from __future__ import annotations

import math
import statistics
import threading
from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg
import torch
from PIL import Image

from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.jpeg import decode, scaled_size
from imgpack.reader.plan import Scaled
from imgpack.reader.resample import resample_record
from imgpack.reader.transform import DeviceTransform, normalise
from workbench.cpu_candidates import CANDIDATES, opencv
from workbench.cpu_yuv import alternate
from workbench.jpeg_decoders import LoopPool

__all__ = ["draws", "record_boxes", "candidate_table", "path_table", "normalise_table"]


def draws(ds: PackedImageDataset, size: int, batch: int, seed: int) -> dict[str, list[Any]]:
    """Per kind ("train", "eval"): the plan of each batch of the pack, in record order."""
    out: dict[str, list[Any]] = {}
    for kind in ("train", "eval"):
        tf = getattr(DeviceTransform, kind)(ds, size)
        gen = torch.Generator().manual_seed(seed)
        plan = Scaled(tf, tuple(ds.shape[:2]))
        out[kind] = [plan(np.arange(s, min(len(ds), s + batch)), gen)
                     for s in range(0, len(ds), batch)]  # fmt: skip
    return out


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 10 * math.log10(255**2 / max(mse, 1e-12))


def _pillow(image: np.ndarray, box: np.ndarray, size: int, flip: bool) -> np.ndarray:
    """Pillow's BILINEAR resample of ``box`` of the whole image: the reference."""
    out = Image.fromarray(image).resize((size, size), Image.BILINEAR, box=tuple(map(float, box)))
    return np.asarray(out)[:, ::-1] if flip else np.asarray(out)


def _truth(folder: Path, name: str, box: np.ndarray, size: int, flip: bool) -> np.ndarray:
    with Image.open(folder / name) as im:
        return _pillow(np.asarray(im.convert("RGB")), box, size, flip)


def candidate_table(ds: PackedImageDataset, folder: Path, plans: dict[str, list[Any]],
                    repeats: int) -> list[dict[str, Any]]:  # fmt: skip
    """One row per candidate and kind of crop: us per crop (median), its multiple of the
    FFCV resize's, worst and mean dB lost against the exact resample, crops over 0.5 dB,
    PSNR against the exact resample (MSE pooled)."""
    return [row for kind, plan in plans.items() for row in _kind(ds, folder, kind, plan, repeats)]


def _sweep(fn: Any, crops: list[Any], records: dict[int, np.ndarray], size: int, out: np.ndarray):
    def run() -> None:
        for k, (i, box, flip, _) in enumerate(crops):
            fn(records[i], box, size, flip, out[k])

    return run


def _kind(ds: PackedImageDataset, folder: Path, kind: str, plan: list[Any],
          repeats: int) -> list[dict[str, Any]]:  # fmt: skip
    crops = [(int(i), record_boxes(p)[k], bool(p.draw.flip[k]), p.draw.boxes[k])
             for p in plan for k, i in enumerate(p.records)]  # fmt: skip
    size = plan[0].draw.size
    records = {i: np.ascontiguousarray(ds[i][0].permute(1, 2, 0).numpy()) for i, *_ in crops}
    outs = {name: np.empty((len(crops), size, size, 3), np.uint8) for name in CANDIDATES}
    times = alternate({n: _sweep(f, crops, records, size, outs[n]) for n, f in CANDIDATES.items()},
                      repeats)  # fmt: skip
    exact = np.stack([_pillow(records[i], box, size, flip) for i, box, flip, _ in crops])
    truths = [_truth(folder, ds.source_path(i), src_box, size, flip)
              for i, _box, flip, src_box in crops]  # fmt: skip
    floor = [min(_psnr(exact[k], t), 50.0) for k, t in enumerate(truths)]
    ffcv = statistics.median(times[list(CANDIDATES)[-1]])
    rows = []
    for name in CANDIDATES:
        got = outs[name]
        loss = [floor[k] - _psnr(got[k], t) for k, t in enumerate(truths)]
        mse = float(np.mean((got.astype(np.float64) - exact) ** 2))
        rows.append({"kind": kind, "candidate": name, "crops": len(crops),
                     "us_per_crop": 1e6 * statistics.median(times[name]) / len(crops),
                     "vs_ffcv": statistics.median(times[name]) / ffcv,
                     "worst_db": max(loss), "mean_db": float(np.mean(loss)),
                     "over": int(sum(v > 0.5 for v in loss)),
                     "psnr_vs_exact": 10 * math.log10(255**2 / max(mse, 1e-12)),
                     "samples_s": times[name]})  # fmt: skip
    return rows


def record_boxes(plan: Any) -> np.ndarray:
    """A planned batch's boxes in the pixels of its records (the plan's are in the decoded
    ones: record i decoded at 1/d)."""
    return plan.draw.crop * plan.scales[:, None]


class _Scratch(threading.local):
    """Each thread's own decode buffer, made in the thread on first use."""

    def __init__(self, nbytes: int) -> None:
        self.buf = np.empty(nbytes, dtype=np.uint8)


def _threads(t: int, fn: Any) -> Any:
    """``fn`` run with torch's threads set to t (and set back)."""
    before = torch.get_num_threads()
    torch.set_num_threads(t)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def path_table(ds: PackedImageDataset, kind: str, plans: list[Any], threads: tuple[int, ...],
               repeats: int) -> list[dict[str, Any]]:  # fmt: skip
    """imgpack's CPU crop path against FFCV's, per thread count: images/s (median pass over
    the pack's batches) and the ratio; then both ends of the float batch training takes:
    imgpack's path with ``imgpack.reader.transform.normalise`` after it, and today's CPU path (the
    records decoded into a canvas, ``DeviceTransform.apply`` of the same plan)."""
    views = ds.encoded(np.arange(len(ds)))
    sizes = ds.record_sizes
    c, size = ds.channels, plans[0].draw.size
    scratch = _Scratch(int(sizes.prod(1).max()) * c)
    pool = LoopPool()
    record_px = [record_boxes(p) for p in plans]
    tf = getattr(DeviceTransform, kind)(ds, size)
    scale = [1 / (255 * v) for v in ds.std]
    shift = [-m / v for m, v in zip(ds.mean, ds.std)]

    def crops(t: int, p: Any) -> np.ndarray:
        out = np.empty((len(p.records), size, size, c), dtype=np.uint8)

        def one(k: int) -> None:
            i, d = int(p.records[k]), int(p.scales[k])
            w, h = int(sizes[i, 0]), int(sizes[i, 1])
            sw, sh = scaled_size(w, h, d)
            pixels = scratch.buf[: sw * sh * c].reshape(sh, sw, c)
            decode(views[i], w, h, c, scale=d, out=pixels, where=f"record {i}")
            resample_record(pixels, p.draw.crop[k], size, bool(p.draw.flip[k]), out[k])

        pool.run(len(p.records), one, t)
        return out

    def ffcv(t: int, p: Any, boxes: np.ndarray) -> np.ndarray:
        out = np.empty((len(p.records), size, size, c), dtype=np.uint8)

        def one(k: int) -> None:
            img = simplejpeg.decode_jpeg(
                views[int(p.records[k])], fastdct=True, buffer=scratch.buf
            )  # FFCV's imdecode: fast DCT
            opencv(img, boxes[k], size, bool(p.draw.flip[k]), out[k])

        pool.run(len(p.records), one, t)
        return out

    def today(t: int, p: Any) -> torch.Tensor:
        canvas = np.empty((len(p.records), *p.hw, c), dtype=np.uint8)
        ds.decode_into(
            p.records, canvas, np.empty(len(p.records), np.int64), p.scales, t, pad=False
        )
        return _threads(t, lambda: tf.apply(torch.from_numpy(canvas).permute(0, 3, 1, 2), p.draw))

    def floats(t: int, p: Any) -> torch.Tensor:
        pixels = torch.from_numpy(crops(t, p))
        return _threads(t, lambda: normalise(pixels, scale, shift, torch.float32))

    def side(t: int, one: Any) -> Any:
        return lambda: [one(t, p) for p in plans]

    fns = {}
    for t in threads:
        fns[("imgpack", t)], fns[("FFCV", t)] = side(t, crops), lambda t=t: [
            ffcv(t, p, b) for p, b in zip(plans, record_px)]  # fmt: skip
        fns[("imgpack + normalise", t)], fns[("today", t)] = side(t, floats), side(t, today)
    try:
        times = alternate(fns, repeats)
    finally:
        pool.close()
    rate = {k: len(ds) / statistics.median(v) for k, v in times.items()}
    return [{"threads": t, "imgpack_images_per_s": rate[("imgpack", t)],
             "ffcv_images_per_s": rate[("FFCV", t)],
             "ratio": rate[("imgpack", t)] / rate[("FFCV", t)],
             "normalised_images_per_s": rate[("imgpack + normalise", t)],
             "today_images_per_s": rate[("today", t)],
             "samples_s": {name: times[(name, t)] for name, tt in times if tt == t},
             "scales": {str(d): int(sum((p.scales == d).sum() for p in plans))
                        for d in (1, 2)}} for t in threads]  # fmt: skip


def normalise_table(batch: int, size: int, threads: tuple[int, ...],
                    repeats: int) -> list[dict[str, Any]]:  # fmt: skip
    """The per-batch normalise of a (B, size, size, 3) uint8 batch into a fresh channels_last
    float tensor, on torch's threads: as ``DeviceTransform`` writes it (``torch.mul(images,
    scale (1, 3, 1, 1), out=...).add_(shift)``) and as ``imgpack.reader.transform.normalise`` does
    (the same values, bit for bit): us per image (median)."""
    pixels = torch.randint(0, 256, (batch, size, size, 3), dtype=torch.uint8)
    scale, shift = [0.0171, 0.0175, 0.0174], [-2.12, -2.04, -1.80]

    def device(dtype: torch.dtype) -> None:
        out = torch.empty((batch, 3, size, size), dtype=torch.float32,
                          memory_format=torch.channels_last)  # fmt: skip
        s, h = (torch.tensor(v).view(1, 3, 1, 1) for v in (scale, shift))
        torch.mul(pixels.permute(0, 3, 1, 2), s, out=out).add_(h)
        if dtype != torch.float32:
            out.to(dtype)

    def run(method: str, dtype: torch.dtype, t: int):
        def go() -> None:
            before = torch.get_num_threads()
            torch.set_num_threads(t)
            try:
                if method == "rows":
                    normalise(pixels, scale, shift, dtype)
                else:
                    device(dtype)
            finally:
                torch.set_num_threads(before)

        return go

    fns = {(m, str(d).replace("torch.", ""), t): run(m, d, t)
           for m in ("DeviceTransform", "rows") for d in (torch.float32, torch.bfloat16)
           for t in threads}  # fmt: skip
    times = alternate(fns, repeats)
    return [{"method": m, "dtype": d, "threads": t,
             "us_per_image": 1e6 * statistics.median(v) / batch, "samples_s": v}
            for (m, d, t), v in times.items()]  # fmt: skip
