"""Table (a) of the CPU kernels' benchmark: yuv420 records to RGB, beside copying raw records.

Both sides read the records of packs the packer made from the same photographs, through a
read-only map of the .bin (as the reader's threads see them), and write each record into
its slot of a reused canvas of the pack's bound, ``threads`` threads sharing the records
(``LoopPool``): "raw copy" is ``np.copyto`` of a raw record (``--resize fit --size R``);
"yuv420 -> RGB" is ``imgpack.format.codec.yuv420_to_rgb(record, w, h, out=slot)`` of a yuv420
record (``--resize fit --size Y --codec yuv420``, Y about R * sqrt(2): the same bytes per
image), into an HWC canvas (B, H, W, 3) or a planar one (B, 3, H, W); "RGB copy" copies the
RGB of those same yuv420 records (converted beforehand) into the HWC canvas, the per-pixel
floor of any conversion there. "torch canvas" is today's CPU delivery of a yuv420 batch:
``imgpack.reader.yuv.canvas_to_rgb`` on the batch's yuv canvas, torch's threads set to the
thread count (its gather into the canvas is not timed).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from imgpack.format.codec import yuv420_planes, yuv420_to_rgb
from imgpack.format.index import read_index
from imgpack.reader.canvas import slot_shape
from imgpack.reader.yuv import canvas_to_rgb
from workbench.jpeg_decoders import LoopPool

__all__ = [
    "Records",
    "read_records",
    "alternate",
    "yuv_table",
    "switched_off",
    "numba_version",
    "opencv_version",
]


class Records(NamedTuple):
    """A pack's records as stored (views of its mapped .bin), their (w, h) and its bound."""

    views: list[np.ndarray]
    sizes: np.ndarray
    shape: tuple[int, int, int]
    codec: str


def read_records(path: str | Path) -> Records:
    """Every record of the pack at ``path``, as read-only views of one map of its .bin."""
    ix = read_index(path)
    data = np.memmap(ix.data_path, dtype=np.uint8, mode="r")
    offsets, base = ix.record_offsets, ix.data_offset
    views = [data[base + offsets[i] : base + offsets[i + 1]] for i in range(ix.count)]
    return Records(views, np.asarray(ix.record_sizes, dtype=np.int64), ix.shape, ix.codec)


def alternate(fns: dict[Any, Callable[[], Any]], repeats: int) -> dict[Any, list[float]]:
    """Seconds per call of each fn: one warm-up each, then ``repeats`` rounds, each calling
    every fn once in turn (so a busy moment of the machine hits every side alike)."""
    for fn in fns.values():
        fn()
    times: dict[Any, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
    return times


def numba_version() -> str | None:
    """numba's version where it is installed (the conversion then runs compiled), else None."""
    try:
        import numba
    except ImportError:
        return None
    return numba.__version__


def opencv_version() -> str | None:
    """OpenCV's version where it is installed (enlarged CPU crops then use it), else None."""
    try:
        import cv2
    except ImportError:
        return None
    return cv2.__version__


def switched_off(fn: Callable[..., Any], switch: str = "IMGPACK_NUMBA") -> Callable[..., Any]:
    """``fn`` run with one of the cpu extra's libraries off (``switch=0`` while it runs):
    ``IMGPACK_NUMBA``, numpy's yuv420 conversion; ``IMGPACK_OPENCV``, torch's crops."""

    def run(*args: Any) -> Any:
        before = os.environ.get(switch)
        os.environ[switch] = "0"
        try:
            return fn(*args)
        finally:
            if before is None:
                del os.environ[switch]
            else:
                os.environ[switch] = before

    return run


def _passes(n: int, batch: int, threads: int, pool: LoopPool, one: Callable[[int, int], None]):
    """A pass over n records in batches: ``one(i, k)`` writes record i into slot k."""

    def run() -> None:
        for start in range(0, n, batch):
            stop = min(n, start + batch)
            pool.run(stop - start, lambda k, start=start: one(start + k, k), threads)

    return run


def _torch_canvas(yuv: Records, batch: int) -> list[tuple[torch.Tensor, np.ndarray]]:
    """The yuv canvases of the pack's batches, as the loader's gather lays them out."""
    h, w, _ = yuv.shape
    hc, wc, _ = slot_shape("yuv420", yuv.shape)
    out = []
    for start in range(0, len(yuv.views), batch):
        idx = np.arange(start, min(len(yuv.views), start + batch))
        canvas = np.zeros((len(idx), 1, hc, wc), dtype=np.uint8)
        for k, i in enumerate(idx):
            rw, rh = yuv.sizes[i]
            y, cb, cr = yuv420_planes(yuv.views[i], int(rw), int(rh))
            canvas[k, 0, :rh, :rw] = y
            canvas[k, 0, h : h + cb.shape[0], : cb.shape[1]] = cb
            canvas[k, 0, h : h + cr.shape[0], wc // 2 : wc // 2 + cr.shape[1]] = cr
        out.append((torch.from_numpy(canvas), yuv.sizes[idx]))
    return out


def yuv_table(yuv: Records, raw: Records, threads: tuple[int, ...], batch: int,
              repeats: int) -> list[dict[str, Any]]:  # fmt: skip
    """One row per side and thread count: images/s (median pass), its share of the raw copy's
    rate at the same threads, ns per output pixel and that as a multiple of the RGB copy's."""
    n = min(len(yuv.views), len(raw.views))
    b = min(batch, n)
    hwc = np.zeros((b, *yuv.shape), dtype=np.uint8)
    planar = np.zeros((b, yuv.shape[2], *yuv.shape[:2]), dtype=np.uint8)
    raw_canvas = np.zeros((b, *raw.shape), dtype=np.uint8)
    rgb = [yuv420_to_rgb(yuv.views[i], *map(int, yuv.sizes[i])) for i in range(n)]
    canvases = _torch_canvas(yuv, b)
    pool = LoopPool()

    def raw_copy(i: int, k: int) -> None:
        w, h = raw.sizes[i]
        np.copyto(raw_canvas[k, :h, :w], raw.views[i].reshape(h, w, raw.shape[2]))

    def to_hwc(i: int, k: int) -> None:
        w, h = yuv.sizes[i]
        yuv420_to_rgb(yuv.views[i], int(w), int(h), out=hwc[k, :h, :w])

    def to_planar(i: int, k: int) -> None:
        w, h = yuv.sizes[i]
        yuv420_to_rgb(yuv.views[i], int(w), int(h), out=planar[k, :, :h, :w].transpose(1, 2, 0))

    def rgb_copy(i: int, k: int) -> None:
        w, h = yuv.sizes[i]
        np.copyto(hwc[k, :h, :w], rgb[i])

    def torch_canvas(t: int) -> Callable[[], None]:
        def run() -> None:
            before = torch.get_num_threads()
            torch.set_num_threads(t)
            try:
                for canvas, sizes in canvases:
                    canvas_to_rgb(canvas, yuv.shape[:2], sizes=sizes)
            finally:
                torch.set_num_threads(before)

        return run

    sides = {"raw copy": raw_copy, "yuv420 -> RGB, HWC canvas": to_hwc,
             "yuv420 -> RGB, planar canvas": to_planar, "RGB copy": rgb_copy}  # fmt: skip
    fns: dict[tuple[str, int], Callable[[], None]] = {}
    for t in threads:
        for name, one in sides.items():
            fns[(name, t)] = _passes(n, b, t, pool, one)
        numpy_side = switched_off(_passes(n, b, t, pool, to_planar))
        fns[("yuv420 -> RGB, planar canvas, numpy", t)] = numpy_side
        fns[("torch canvas", t)] = torch_canvas(t)
    try:
        times = alternate(fns, repeats)
    finally:
        pool.close()
    pixels = {"raw": float(raw.sizes[:n].prod(1).sum()), "yuv": float(yuv.sizes[:n].prod(1).sum())}
    rate = {k: n / statistics.median(v) for k, v in times.items()}
    ns = {k: 1e9 * statistics.median(v) / pixels["raw" if k[0] == "raw copy" else "yuv"]
          for k, v in times.items()}  # fmt: skip
    rows = []
    for (name, t), r in rate.items():
        rows.append({"side": name, "threads": t, "images_per_s": r,
                     "vs_raw_copy": r / rate[("raw copy", t)],
                     "ns_per_pixel": ns[(name, t)] * t,  # CPU time: t threads at once
                     "vs_rgb_copy": ns[(name, t)] / ns[("RGB copy", t)],
                     "scaling": r / rate[(name, threads[0])] * threads[0] / t,
                     "samples_s": times[(name, t)]})  # fmt: skip
    return rows
