"""What the GPU proof measures: copy ceilings, one loader's training run, GPU utilisation, chart.

Kept apart from the proof's driver (which builds data and loaders). Every CUDA-only
number degrades to ``None`` plus a reason on a machine without CUDA or nvidia-smi,
so the CPU dry run exercises the same code and the same JSON keys.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, is_dataclass
from datetime import datetime
from pathlib import Path

import torch

from imgpack.diagnose.meter import watch
from imgpack.reader.device import to_device
from workbench.errors import ProofError

__all__ = [
    "IMAGE_SIZE",
    "CUDA_ONLY",
    "measure_ceilings",
    "GpuUtilSampler",
    "time_training",
    "machine_facts",
    "write_chart",
]

IMAGE_SIZE = 224
CUDA_ONLY = "CUDA-only measurement; device is cpu"


def measure_ceilings(
    batch_size: int, device: torch.device, *, warmup: int = 3, repeats: int = 20
) -> dict:
    """Median GB/s for one uint8 (B,3,224,224) batch: host->device pinned and pageable, device copy.

    GB/s counts the batch's bytes once (a device copy reads and writes, so
    memory traffic is twice that).
    """
    shape = (batch_size, 3, IMAGE_SIZE, IMAGE_SIZE)
    out = {"batch_bytes": math.prod(shape), "repeats": repeats, "method": "CUDA events, median"}
    if device.type != "cuda":
        nulls = dict.fromkeys(("h2d_pinned_gbps", "h2d_pageable_gbps", "d2d_gbps"))
        return {**out, **nulls, "reason": CUDA_ONLY}
    pageable = torch.randint(0, 256, shape, dtype=torch.uint8)
    pinned = pageable.pin_memory()
    dst = torch.empty(shape, dtype=torch.uint8, device=device)
    other = torch.empty_like(dst)

    def gbps(src: torch.Tensor, to: torch.Tensor) -> float:
        seconds = []
        for i in range(warmup + repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            to.copy_(src, non_blocking=True)
            b.record()
            b.synchronize()
            if i >= warmup:
                seconds.append(a.elapsed_time(b) / 1e3)
        return out["batch_bytes"] / statistics.median(seconds) / 1e9

    out["h2d_pinned_gbps"] = gbps(pinned, dst)
    out["h2d_pageable_gbps"] = gbps(pageable, dst)
    out["d2d_gbps"] = gbps(dst, other)
    return {**out, "reason": None}


def _hex(uuid: str) -> str:
    """A GPU UUID reduced to its hex digits: "GPU-6b8a..." (nvidia-smi) and torch's forms agree."""
    return "".join(c for c in uuid.lower().removeprefix("gpu-") if c in "0123456789abcdef")


class GpuUtilSampler:
    """``nvidia-smi --query-gpu=... -lms 100`` in a subprocess for the length of a ``with`` block.

    Rows carry nvidia-smi's own timestamps (so pipe buffering cannot skew them)
    and GPU UUIDs (so only the GPU torch uses is counted). On CPU, or without
    nvidia-smi, it samples nothing and says why.
    """

    def __init__(self, device: torch.device, interval_ms: int = 100) -> None:
        self.rows: list[tuple[float, str, float]] = []
        self.reason: str | None = None
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self._uuid = ""
        exe = shutil.which("nvidia-smi")
        if device.type != "cuda":
            self.reason = CUDA_ONLY
        elif exe is None:
            self.reason = "nvidia-smi not found on PATH"
        else:
            query = "--query-gpu=timestamp,uuid,utilization.gpu"
            self._cmd = [exe, query, "--format=csv,noheader,nounits", "-lms", str(interval_ms)]
            self._uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", ""))

    def _read(self) -> None:
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 3:
                continue
            try:
                value = float(parts[2])
            except ValueError:
                continue  # "[N/A]": no sample this tick
            try:
                when = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            except ValueError:
                when = time.time()  # an unexpected stamp format: fall back to arrival time
            self.rows.append((when, parts[1], value))

    def __enter__(self) -> GpuUtilSampler:
        if self.reason is None:
            try:
                self._proc = subprocess.Popen(
                    self._cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
                )
            except OSError as exc:
                self.reason = f"nvidia-smi did not start: {exc}"
                return self
            self._thread = threading.Thread(target=self._read, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=5)
        self._thread.join(timeout=5)

    def result(self, start: float, end: float) -> dict:
        """Mean utilisation in [start, end] (time.time() seconds), samples relative to start."""
        uuids = sorted({u for _, u, _ in self.rows})
        mine = [u for u in uuids if _hex(u) and _hex(self._uuid) and _hex(u) in _hex(self._uuid)]
        uuid = mine[0] if mine else (uuids[0] if len(uuids) == 1 else None)
        inside = [(t - start, v) for t, u, v in self.rows if u == uuid and start <= t <= end]
        reason = self.reason
        if reason is None and uuid is None:
            reason = f"nvidia-smi listed {len(uuids)} GPUs; none matched torch's {self._uuid!r}"
        elif reason is None and not inside:
            reason = "nvidia-smi gave no samples during the run"
        mean = statistics.fmean(v for _, v in inside) if inside else None
        return {"mean_percent": mean, "samples": inside, "gpu_uuid": uuid, "reason": reason}


def _take(loader: Iterable, n: int) -> Iterator:
    """Exactly n batches, starting a new epoch whenever the loader runs dry."""
    given = 0
    while given < n:
        before = given
        for batch in loader:
            yield batch
            given += 1
            if given == n:
                return
        if given == before:
            raise ProofError(f"loader: expected {n} batches, found an empty epoch after {given}")


def _plain(value):
    """The meter's summary as JSON-ready data."""
    if is_dataclass(value):
        return asdict(value)
    return dict(vars(value)) if hasattr(value, "__dict__") else value


def time_training(
    loader: Iterable,
    transform: Callable,
    train_step: Callable,
    *,
    warmup: int,
    steps: int,
    ceilings: dict,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Warm up, then run ``steps`` steps through the starvation meter, keeping per-step times.

    Each (images, labels) batch goes to ``train_step.device`` with imgpack's
    ``to_device`` (timed alone with CUDA events: the host->device copy), then
    through ``transform`` on the device. Each step ends with a synchronize, so
    a step's time is the GPU's. ``timeline`` rows are [start, wait, step] seconds
    from the first measured step. ``warmup`` >= 1: the starvation meter's own
    warm-up batch is the last of them.
    """
    dev = train_step.device
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else None
    copies: list = []
    moved = seen = 0

    def prepare(batch):
        nonlocal moved, seen
        images, labels = batch
        seen += len(images)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if cuda else None
        if ev:
            ev[0].record()
        x, y = to_device((images, labels), dev)
        if ev:
            ev[1].record()
            copies.append(ev)
        moved += images.nbytes + labels.nbytes
        return transform(x), y

    if warmup < 1:
        raise ProofError(f"warmup: expected at least 1 step (the meter's own), found {warmup}")
    batches = _take(loader, warmup + steps)
    timeline, loss = [], None
    # The meter keeps its first batch out of every number, so it starts on the last
    # warm-up batch and then measures exactly ``steps`` batches, as the timeline does.
    meter = watch(batches, every=5.0, log=log, progress=False, sync=sync)
    with GpuUtilSampler(dev) as util:
        t0 = time.perf_counter()
        for _ in range(warmup - 1):
            train_step(*prepare(next(batches)))
        metered = iter(meter)
        train_step(*prepare(next(metered)))
        if sync:
            sync()
        warmup_s = time.perf_counter() - t0
        copies.clear()
        moved = seen = 0
        wall0 = time.time()
        start = prev = time.perf_counter()
        for batch in metered:
            got = time.perf_counter()
            loss = train_step(*prepare(batch))
            if sync:
                sync()
            done = time.perf_counter()
            timeline.append([prev - start, got - prev, done - got])
            prev = done
        elapsed = prev - start
    if len(timeline) != steps:
        raise ProofError(f"loader: expected {steps} measured batches, found {len(timeline)}")
    summary = meter.summary()
    h2d = {"bytes": moved, "copy_s": None, "gbps": None, "of_pinned_ceiling": None}
    h2d["reason"] = CUDA_ONLY
    if cuda:
        copy_s = sum(a.elapsed_time(b) for a, b in copies) / 1e3
        gbps = moved / copy_s / 1e9 if copy_s > 0 else None
        ceiling = ceilings.get("h2d_pinned_gbps")
        h2d.update(copy_s=copy_s, gbps=gbps, reason=None)
        h2d["of_pinned_ceiling"] = gbps / ceiling if gbps and ceiling else None
    return {
        "images_per_s": seen / elapsed,
        "images": seen,
        "data_wait_fraction": summary.data_wait_fraction,
        "timeline_wait_fraction": sum(t[1] for t in timeline) / elapsed,
        "meter": _plain(summary),
        "meter_line": summary.line(),
        "warmup_s": warmup_s,
        "measured_s": elapsed,
        "final_loss": None if loss is None else float(loss),
        "model_params": getattr(train_step, "params", None),
        "gpu_util": util.result(wall0, wall0 + elapsed),
        "h2d": h2d,
        "timeline": timeline,
    }


def machine_facts(device: torch.device) -> dict:
    """What a reader of the numbers needs to know about the machine that made them."""
    facts = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "gpu_name": None,
        "gpu_memory_gib": None,
        "gpu_count": 0,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts["cudnn"] = torch.backends.cudnn.version()
        facts["gpu_name"] = props.name
        facts["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        facts["gpu_count"] = torch.cuda.device_count()
    return facts


def write_chart(result: dict, path: Path) -> None:
    """Per-step timeline for each loader: red while waiting for data, green while stepping."""
    from matplotlib.figure import Figure

    names = list(result["loaders"])
    fig = Figure(figsize=(12, 2.6 * len(names) + 0.8), layout="constrained")
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    for ax, name in zip(axes, names):
        run = result["loaders"][name]
        steps = run["timeline"]
        waits = [(t, w) for t, w, _ in steps]
        busy = [(t + w, c) for t, w, c in steps]
        ax.broken_barh(waits, (0, 100), color="tab:red", lw=0, label="waiting for data")
        ax.broken_barh(
            busy, (0, 100), color="tab:green", alpha=0.5, lw=0, label="step (copy+compute)"
        )
        util = run["gpu_util"]
        if util["samples"]:
            t, u = zip(*util["samples"])
            ax.step(t, u, where="post", color="black", lw=1, label="GPU utilisation %")
        ax.set_ylim(0, 105)
        ax.set_ylabel("GPU util %")
        title = f"{name}: {run['images_per_s']:.0f} images/s, "
        title += f"data wait {run['data_wait_fraction']:.1%} of step time"
        if util["mean_percent"] is not None:
            title += f", GPU util {util['mean_percent']:.0f}% (nvidia-smi)"
        ax.set_title(title, loc="left")
        ax.legend(loc="lower right", fontsize=8)
    axes[-1].set_xlabel("seconds since the first measured step")
    m = result["machine"]
    where = m["gpu_name"] or "CPU (dry run)"
    fig.suptitle(f"imgpack GPU proof: {where}, {m['cpu_count']} CPUs, torch {m['torch']}")
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=100)
    os.replace(tmp, path)
