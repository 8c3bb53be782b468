"""Decode speed (issue 20, table b) and images/s ready for the device transform (table c).

Both tables run on the records of one pack made by the packer (``--resize fit --size S
--codec jpeg --quality Q``: sources that qualify kept as they came, the rest encoded),
read through the mapping (``ds.encoded``) by every decoder.

(b) decode: every record decoded once per pass, passes alternated between the decoders
    and repeated, the median pass reported. "imgpack decode_into" is the reader's batch
    path (``ds.decode_into``: batches of ``batch`` records into a reused canvas of the
    pack's bound, zero beyond each record); "imgpack decode_into, packed" the same into a
    1-D buffer, the records end to end (what a loader bound for a CUDA device runs:
    ``read.DecodePacked``); "imgpack decode" is ``imgpack.reader.jpeg.decode``
    alone on the reader's pool; "simplejpeg loop" is the plain loop the issue compares with
    (2 threads: two plain loops sharing the records); "Pillow loop" is the same loop with
    ``Image.open(...).convert("RGB")``.
(c) delivery: an epoch of batches. "imgpack" is the loader's stages up to the device as
    ``make_loader(ds, batch, transform=DeviceTransform.train(ds, out))`` chooses them for a
    GPU (``gpu_stages``): the crops drawn, each record decoded at the scale its crop needs
    into a canvas, the batch and the draw handed on, which is what the device transform
    takes.
    "FFCV" is FFCV's JPEG pipeline on the CPU over the very boxes the loader drew (record
    pixels, rounded as FFCV's crops are whole pixels): full-size libjpeg-turbo decode
    (simplejpeg) into a buffer each thread reuses, ``cv2.resize(..., INTER_AREA)`` of the
    box to out x out straight into the batch (Pillow's BOX filter where OpenCV is not
    installed, and the row says so). Both on ``threads`` threads: the loader's
    ``gather_threads``, FFCV's on a ``LoopPool``. "imgpack packed" is the loader's CPU stage
    as it runs for a CUDA device, read before the delivery: the same plan, each batch's
    records decoded end to end, as they leave for the device (which lays out the canvas
    and resamples; neither is timed here, nor is FFCV's copy to the device).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import simplejpeg
import torch
from PIL import Image

from imgpack.reader.augment import Draw, to_record
from imgpack.reader.augment import geometry as record_geometry
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.inprocess import BufferPool, InProcess, Reading
from imgpack.reader.jpeg import SCALES, decode
from imgpack.reader.order import EpochOrder
from imgpack.reader.plan import OrderSampler, Plan, Scaled
from imgpack.reader.read import Pixels, Setup
from imgpack.reader.threads import POOL
from imgpack.reader.transform import DeviceTransform
from workbench.jpeg_decoders import LoopPool, pillow_decode, plain_decode

__all__ = ["decode_table", "delivery_table", "ffcv_resize", "gpu_stages"]


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


def _loops(fn: Callable[[Any], Any], bufs: list[Any], threads: int, pool: LoopPool):
    """``threads`` plain loops calling ``fn`` on the records, sharing them."""
    return lambda: pool.run(len(bufs), lambda i: fn(bufs[i]), threads)


def decode_table(ds: PackedImageDataset, threads: tuple[int, ...], batch: int,
                 repeats: int) -> list[dict[str, Any]]:  # fmt: skip
    """One row per decoder and thread count: images/s (median pass), per thread, scaling
    from the first thread count, and the share of the simplejpeg loop's rate."""
    n = len(ds)
    views = ds.encoded(np.arange(n))
    copies = [bytes(v) for v in views]  # Pillow reads from a file object
    sizes = ds.record_sizes
    canvas = np.empty((batch, *ds.shape), dtype=np.uint8)
    labels = np.empty(batch, dtype=np.int64)
    pool = LoopPool()

    def decode_one(i: int) -> None:
        decode(views[i], int(sizes[i, 0]), int(sizes[i, 1]), ds.channels, where=f"record {i}")

    def decode_into(t: int, packed: bool = False) -> None:
        for start in range(0, n, batch):
            idx = np.arange(start, min(n, start + batch))
            out = canvas.reshape(-1) if packed else canvas[: len(idx)]
            ds.decode_into(idx, out, labels[: len(idx)], None, t)

    fns: dict[tuple[str, int], Callable[[], Any]] = {}
    for t in threads:
        fns[("imgpack decode_into", t)] = lambda t=t: decode_into(t)
        fns[("imgpack decode_into, packed", t)] = lambda t=t: decode_into(t, True)
        fns[("imgpack decode", t)] = lambda t=t: POOL.run(n, decode_one, t)
        fns[("simplejpeg loop", t)] = _loops(plain_decode, views, t, pool)
        fns[("Pillow loop", t)] = _loops(pillow_decode, copies, t, pool)
    try:
        times = _median_passes(fns, repeats)
    finally:
        pool.close()
    rate = {k: n / statistics.median(v) for k, v in times.items()}
    rows = []
    for (name, t), r in rate.items():
        one = rate[(name, threads[0])] * t / threads[0]
        rows.append({"decoder": name, "threads": t, "images_per_s": r, "per_thread": r / t,
                     "scaling": r / one, "vs_simplejpeg": r / rate[("simplejpeg loop", t)],
                     "samples_s": times[(name, t)]})  # fmt: skip
    return rows


def ffcv_resize() -> tuple[Callable[[np.ndarray, int, np.ndarray], Any], str]:
    """FFCV's CPU resize of a crop into its slot of the batch (OpenCV INTER_AREA, one
    thread per call, as FFCV calls it), or Pillow's BOX filter where OpenCV is missing."""
    try:
        import cv2
    except ImportError:

        def pillow(a: np.ndarray, n: int, dst: np.ndarray) -> None:
            dst[...] = np.asarray(Image.fromarray(a).resize((n, n), Image.BOX))

        return pillow, "Pillow BOX (OpenCV is not installed: not FFCV's own resize)"
    cv2.setNumThreads(1)  # the benchmark's threads are the parallelism, as on imgpack's side

    def area(a: np.ndarray, n: int, dst: np.ndarray) -> None:
        cv2.resize(a, (n, n), dst=dst, interpolation=cv2.INTER_AREA)

    return area, f"cv2.resize INTER_AREA (OpenCV {cv2.__version__})"


class _Scratch(threading.local):
    """Each thread's own decode buffer (made in the thread on its first use)."""

    def __init__(self, nbytes: int) -> None:
        self.buf = np.empty(nbytes, dtype=np.uint8)


def _ffcv_batch(bufs: list[Any], idx, boxes, size: int, threads: int, resize, pool, scratch):
    """FFCV's batch: each record decoded whole into its thread's own buffer (as FFCV's
    decoder reuses one), its integer box resized to size x size into the batch."""
    out = np.empty((len(idx), size, size, 3), dtype=np.uint8)
    ints = np.rint(boxes).astype(np.int64)

    def one(k: int) -> None:
        img = simplejpeg.decode_jpeg(bufs[idx[k]], buffer=scratch.buf)
        x0, y0, x1, y1 = ints[k]
        resize(img[y0 : max(y1, y0 + 1), x0 : max(x1, x0 + 1)], size, out[k])

    pool.run(len(idx), one, threads)
    return torch.from_numpy(out)


def _epoch(loader) -> int:
    n = 0
    for _images, labels in loader:
        n += len(labels)
    return n


def delivery_table(ds: PackedImageDataset, threads: tuple[int, ...], batch: int, size: int,
                   epochs: int, seed: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """images/s delivered by each side per thread count (median epoch), and their ratio."""
    views = ds.encoded(np.arange(len(ds)))
    resize, resize_name = ffcv_resize()
    pool = LoopPool()
    scratch = _Scratch(int(ds.record_sizes.prod(1).max()) * ds.channels)
    rows = []
    try:
        for t in threads:
            tf = DeviceTransform.train(ds, size, generator=torch.Generator().manual_seed(seed))
            canvas, plan_c = gpu_stages(ds, tf, batch, seed, t, Pixels)
            draws = [b.draw for b in _leaving_pass(canvas, plan_c)]  # FFCV gets these boxes
            plan = []
            for d in draws:
                geo = record_geometry(ds, d.records, ds.shape[:2])
                plan.append((d.records, to_record(torch.from_numpy(d.boxes), geo).numpy()))
            picked = np.concatenate([_scales(d, ds) for d in draws])
            cuda_bound, scaled = gpu_stages(ds, tf, batch, seed, t, Pixels)
            times = _median_passes({
                "imgpack": lambda s=canvas, p=plan_c: _leaving_epoch(s, p),
                "imgpack packed": lambda s=cuda_bound, p=scaled: _leaving_epoch(s, p),
                "FFCV": lambda t=t, plan=plan: [
                    _ffcv_batch(views, i, b, size, t, resize, pool, scratch) for i, b in plan],
            }, epochs)  # fmt: skip
            canvas.close()
            cuda_bound.close()
            ours = len(ds) / statistics.median(times["imgpack"])
            packed = len(ds) / statistics.median(times["imgpack packed"])
            theirs = len(ds) / statistics.median(times["FFCV"])
            rows.append({"threads": t, "batch": batch, "size": size,
                         "imgpack_images_per_s": ours, "ffcv_images_per_s": theirs,
                         "ratio": ours / theirs, "packed_images_per_s": packed,
                         "packed_ratio": packed / theirs,
                         "packed_samples_s": times["imgpack packed"], "ffcv_resize": resize_name,
                         "scales": {str(d): int((picked == d).sum()) for d in SCALES},
                         "imgpack_samples_s": times["imgpack"],
                         "ffcv_samples_s": times["FFCV"]})  # fmt: skip
    finally:
        pool.close()
    return rows


def gpu_stages(ds: PackedImageDataset, tf: DeviceTransform, batch: int, seed: int,
             threads: int, read: Any) -> tuple[InProcess, Plan]:  # fmt: skip
    """The loader's stages up to the device as ``make_loader`` chooses them for a GPU's
    transform (a ``Scaled`` plan, the read in a background thread): ``read`` ``Pixels``
    decodes into the canvas the transform takes, ``DecodePacked`` end to end, as the batch
    leaves for a CUDA device, which lays them out as the canvas there. Read before the
    delivery: the transform is the device's work."""
    bound = tuple(ds.shape[:2])
    plan = Plan(OrderSampler(EpochOrder(len(ds), batch_size=batch, seed=seed)), bound,
                Scaled(tf, bound))  # fmt: skip
    stage = read(ds, Setup(BufferPool(6), threads, pad=False))
    return InProcess(Reading(stage), prefetch=2), plan


def _leaving_pass(source: InProcess, plan: Plan) -> list[Any]:
    plan.begin(0, 0)
    return list(source.batches(plan))


def _leaving_epoch(source: InProcess, plan: Plan) -> int:
    plan.begin(0, 0)
    return sum(len(batch.records) for batch in source.batches(plan))


def _scales(draw: Draw, ds: PackedImageDataset) -> np.ndarray:
    """The denominator each record of ``draw`` was decoded at (its sizes are the decoded ones)."""
    w, decoded = ds.record_sizes[draw.records][:, 0], draw.sizes[:, 0]
    out = np.ones(len(w), dtype=np.int64)
    for d in reversed(SCALES):  # the smallest d giving that width, as exact_scale picks
        out[-(-w // d) == decoded] = d
    return out
