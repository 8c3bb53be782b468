"""No GPU: every pack kind delivered to the CPU, beside FFCV's CPU pipeline, in one run.

The same photographs (``sample.make_sample_folder``), packed four ways with the packer
(``--resize fit``): jpeg at 256 (q90), raw at 256, raw at 362, yuv420 at 362. Every row
runs an epoch of batches on ``threads`` threads, batch ``batch``, warm page cache; the rows
alternate, ``alternations`` times, and each reports its median images/s:

``FFCV, uint8``      FFCV's JPEG pipeline emulated (FFCV itself is not installed): each
                     record decoded whole (simplejpeg, with libjpeg-turbo's fast DCT, as
                     FFCV's ``imdecode`` asks for) into its thread's buffer, the box the
                     loader drew rounded to whole pixels and resized by ``ffcv_resize``
                     (OpenCV's INTER_AREA where installed) into the batch, one uint8 batch
                     reused every batch, as FFCV reuses its batches' memory.
``FFCV, float``      the same, then the flip and the normalise to the float batch a training
                     step takes (the normalise is imgpack's own, the fastest we have, split
                     over the threads as FFCV's compiled loop is), into one float buffer
                     reused every batch.
``FFCV eval, float`` the same over the boxes ``DeviceTransform.eval(ds, S)`` draws.
``imgpack train``    ``make_loader(ds, B, transform=DeviceTransform.train(ds, S),
                     device="cpu")``: the float batch, the crops made by the loader's threads.
                     ``..., torch crops`` is the same row with ``IMGPACK_OPENCV=0``: every
                     crop by torch's kernel, what a machine without the ``cpu`` extra runs.
``imgpack eval``     the same with ``DeviceTransform.eval(ds, S)``.
``imgpack decoded``  the jpeg records decoded into their canvas, the crop left for a device
                     (``transform=lambda x, r: x``).
``... RGB``          a raw or yuv420 pack delivered as its RGB canvas to ``device="cpu"``
                     (``transform=lambda x, r: x``): a yuv420 record converted by the
                     loader's threads, compiled where numba is installed (the cpu extra);
                     ``..., numpy`` is the same row with ``IMGPACK_NUMBA=0``, numpy's
                     conversion, in the same run.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import simplejpeg
import torch

from imgpack.packer.pack import pack_folder
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.options import InProcessOptions
from imgpack.reader.transform import DeviceTransform, normalise
from workbench.bench_jpeg_speed import ffcv_resize
from workbench.cpu_yuv import numba_version, opencv_version, switched_off
from workbench.jpeg_decoders import LoopPool
from workbench.report import machine_info
from workbench.sample import make_sample_folder

__all__ = ["FULL", "QUICK", "run_cpu_bench", "report"]

FULL = {"photos": 2000, "batch": 256, "size": 224, "threads": 2, "epochs": 2,
        "alternations": 3}  # fmt: skip
QUICK = {"photos": 40, "batch": 8, "size": 32, "threads": 2, "epochs": 1, "alternations": 1}
PACKS = {"jpeg 256": ("jpeg", 256), "raw 256": ("raw", 256), "raw 362": ("raw", 362),
         "yuv420 362": ("yuv420", 362)}  # fmt: skip


def _canvas(images: Any, records: Any) -> Any:
    return images  # records of many sizes: their padded canvas, as it comes


class _Scratch(threading.local):
    def __init__(self, nbytes: int) -> None:
        self.buf = np.empty(nbytes, dtype=np.uint8)


class Ffcv:
    """FFCV's CPU pipeline, emulated, over the boxes and flips imgpack's loader drew."""

    def __init__(self, ds: PackedImageDataset, draws: list[Any], threads: int, floats: bool):
        self.ds, self.draws, self.threads, self.floats = ds, draws, threads, floats
        self.views = ds.encoded(np.arange(len(ds)))
        self.resize, self.resize_name = ffcv_resize()
        self.pool, self.scratch = LoopPool(), _Scratch(int(np.prod(ds.shape)))
        self.out: np.ndarray | None = None  # FFCV reuses its batches' memory
        self.floats_out: torch.Tensor | None = None
        t = DeviceTransform.train(ds, 8)
        self.scale, self.shift = [1 / (255 * s) for s in t.std], [-m / s for m, s in
                                                                   zip(t.mean, t.std)]  # fmt: skip

    def epoch(self) -> int:
        return sum(self.batch(draw) for draw in self.draws)

    def batch(self, draw: Any) -> int:
        size, idx = draw.size, draw.records
        shape = (len(idx), size, size, 3)
        if self.out is None or self.out.shape != shape:
            self.out = np.empty(shape, dtype=np.uint8)
            self.floats_out = torch.empty(shape, dtype=torch.float32) if self.floats else None
        out, floats = self.out, self.floats_out
        boxes, flips = np.rint(draw.crop).astype(np.int64), draw.flip

        def one(k: int) -> None:
            img = simplejpeg.decode_jpeg(self.views[idx[k]], fastdct=True,
                                         buffer=self.scratch.buf)  # fmt: skip
            x0, y0, x1, y1 = boxes[k]
            self.resize(img[y0 : max(y1, y0 + 1), x0 : max(x1, x0 + 1)], size, out[k])
            if self.floats and flips[k]:  # as fast a flip as we have (numba's, in FFCV)
                slot = torch.from_numpy(out[k])
                slot.copy_(slot.flip(1))

        self.pool.run(len(idx), one, self.threads)
        if floats is not None:  # a part of the batch per thread
            step = -(-len(idx) // self.threads)

            def part(j: int) -> None:
                lo, hi = j * step, min((j + 1) * step, len(idx))
                normalise(torch.from_numpy(out[lo:hi]), self.scale, self.shift, torch.float32,
                          floats[lo:hi])  # fmt: skip

            self.pool.run(self.threads, part, self.threads)
        return len(idx)

    def close(self) -> None:
        self.pool.close()


def _epoch(loader: Any) -> int:
    return sum(len(labels) for _, labels, *_ in loader)


def run_cpu_bench(work: str, *, quick: bool = False, seed: int = 0,
                  log: Callable[[str], None] = print) -> dict:  # fmt: skip
    """The rows of the module docstring, alternated; returns the JSON-ready result."""
    cfg = QUICK if quick else FULL
    work_dir = Path(work)
    photos = make_sample_folder(work_dir / "photos", classes=10,
                                per_class=cfg["photos"] // 10, seed=seed)  # fmt: skip
    ds = {}
    for name, (codec, side) in PACKS.items():
        out = work_dir / f"{codec}{side}.bin"
        pack_folder(photos, out, size=(side, side), resize="fit", codec=codec, progress=False,
                    force=True)  # fmt: skip
        ds[name] = PackedImageDataset(out)
    log(f"{cfg['photos']} photos packed four ways in {work_dir}")
    b, s, t = cfg["batch"], cfg["size"], cfg["threads"]
    opts = InProcessOptions(gather_threads=t)
    jpeg = ds["jpeg 256"]

    def loader(name: str, transform: Any) -> Any:
        return make_loader(ds[name], b, seed=seed, transform=transform, device="cpu",
                           options=opts)  # fmt: skip

    train = DeviceTransform.train(jpeg, s, generator=torch.Generator().manual_seed(seed))
    ours, evaluate = loader("jpeg 256", train), loader("jpeg 256", DeviceTransform.eval(jpeg, s))

    def drawn(ld: Any) -> list[Any]:
        return [ld.plan.draws(idx, ld.plan.generator(0, k)).draw
                for k, idx in enumerate(ld.order.batches(0))]  # fmt: skip

    draws, eval_draws = drawn(ours), drawn(evaluate)
    ffcv = {
        "FFCV, uint8": Ffcv(jpeg, draws, t, False),
        "FFCV, float": Ffcv(jpeg, draws, t, True),
        "FFCV eval, float": Ffcv(jpeg, eval_draws, t, True),
    }
    rows: dict[str, Callable[[], int]] = {
        **{name: f.epoch for name, f in ffcv.items()},
        "imgpack train, jpeg 256": lambda: _epoch(ours),
        "imgpack eval, jpeg 256": lambda: _epoch(evaluate),
        "imgpack train, jpeg 256, torch crops": switched_off(lambda: _epoch(ours),
                                                             "IMGPACK_OPENCV"),
        "imgpack eval, jpeg 256, torch crops": switched_off(lambda: _epoch(evaluate),
                                                            "IMGPACK_OPENCV"),
        "imgpack decoded, jpeg 256": (lambda ld: lambda: _epoch(ld))(loader("jpeg 256", _canvas)),
        "imgpack train, yuv420 362": (lambda ld: lambda: _epoch(ld))(loader("yuv420 362", (
            DeviceTransform.train(ds["yuv420 362"], s)))),
        **{f"imgpack RGB, {name}": (lambda ld: lambda: _epoch(ld))(loader(name, _canvas))
           for name in ("raw 256", "raw 362", "yuv420 362")},
        "imgpack RGB, yuv420 362, numpy": switched_off(
            (lambda ld: lambda: _epoch(ld))(loader("yuv420 362", _canvas))),
    }  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in rows}
    for epoch in rows.values():
        epoch()  # untimed: page tables, buffers, the threads
    load_before = list(__import__("os").getloadavg())
    for _ in range(cfg["alternations"]):
        for name, epoch in rows.items():
            for _ in range(cfg["epochs"]):
                t0 = time.perf_counter()
                n = epoch()
                times[name].append(n / (time.perf_counter() - t0))
    for f in ffcv.values():
        f.close()
    rates = {name: statistics.median(v) for name, v in times.items()}
    return {
        "config": cfg, "machine": machine_info(), "numba": numba_version(),
        "opencv": opencv_version(),
        "ffcv_resize": ffcv["FFCV, uint8"].resize_name,
        "load_before": load_before, "load_after": list(__import__("os").getloadavg()),
        "records": len(jpeg), "rates": rates, "samples": times,
        "ratios": {
            "train vs FFCV uint8": rates["imgpack train, jpeg 256"] / rates["FFCV, uint8"],
            "train vs FFCV float": rates["imgpack train, jpeg 256"] / rates["FFCV, float"],
            "eval vs FFCV eval float": (rates["imgpack eval, jpeg 256"]
                                        / rates["FFCV eval, float"]),
            "train torch crops vs FFCV float": (rates["imgpack train, jpeg 256, torch crops"]
                                                / rates["FFCV, float"]),
            "eval torch crops vs FFCV eval float": (
                rates["imgpack eval, jpeg 256, torch crops"] / rates["FFCV eval, float"]),
            "yuv420 362 vs raw 362": (rates["imgpack RGB, yuv420 362"]
                                      / rates["imgpack RGB, raw 362"]),
            "yuv420 362 vs raw 256": (rates["imgpack RGB, yuv420 362"]
                                      / rates["imgpack RGB, raw 256"]),
            "yuv420 362 numpy vs raw 362": (rates["imgpack RGB, yuv420 362, numpy"]
                                            / rates["imgpack RGB, raw 362"]),
        },
    }  # fmt: skip


def report(result: dict) -> str:
    """The markdown table and ratios for docs/benchmarks.md."""
    lines = ["| pipeline, all on the CPU | images/s |", "|---|---:|"]
    lines += [f"| {name} | {rate:,.0f} |" for name, rate in result["rates"].items()]
    lines += ["", "| ratio | |", "|---|---:|"]
    lines += [f"| {name} | {value:.2f}x |" for name, value in result["ratios"].items()]
    load = f"{result['load_before'][0]:.2f} before, {result['load_after'][0]:.2f} after"
    lines += [
        "",
        f"FFCV's resize: {result['ffcv_resize']}; numba {result.get('numba')}; load average {load}",
    ]
    return "\n".join(lines)
