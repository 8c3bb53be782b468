"""The GPU proof: one training loop fed the usual per-file way and fed by imgpack, side by side.

Every CPU benchmark is a proxy; users believe the same ResNet-50 step, on a real
GPU, with its idle time shown for both loaders. The run measures the copy
ceilings first (so "achieved GB/s" has a yardstick), packs a sample folder,
trains once per loader for a fixed number of steps, and writes the numbers
(``gpu_proof.json``) and a busy-vs-waiting timeline (``gpu_proof.png``).
``dry_run`` shrinks everything to a few CPU seconds so the test suite keeps it alive;
``dry_run`` with ``device="cuda"`` is a seconds-long smoke test of every CUDA path.
Entry point and the exact GPU command: ``scripts/gpu_proof.py``.
"""

from __future__ import annotations

import gc
import json
import math
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import click
import torch

from imgpack.errors import ImgpackError
from imgpack.packer.pack import pack_folder, pack_workers
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.transform import DeviceTransform
from workbench.baseline import PerFileImageDataset, baseline_loader
from workbench.errors import ProofError
from workbench.gpu_measure import (
    IMAGE_SIZE,
    machine_facts,
    measure_ceilings,
    time_training,
    write_chart,
)
from workbench.models import TrainStep, resnet50, tiny_resnet
from workbench.sample import make_sample_folder

__all__ = ["ProofSettings", "settings_for", "run_proof", "main"]


@dataclass(frozen=True)
class ProofSettings:
    """Everything that sizes one run; ``settings_for`` picks the defaults."""

    device: str
    steps: int
    warmup: int
    batch_size: int
    model: str
    classes: int
    per_class: int
    workers: int | None
    dry_run: bool


def settings_for(
    *,
    dry_run: bool = False,
    device: str | None = None,
    steps: int | None = None,
    batch_size: int | None = None,
    workers: int | None = None,
) -> ProofSettings:
    """Defaults sized for < 8 min on one H200-class GPU with 16 cores, or seconds on CPU.

    A generated sample holds (warmup + steps) * batch_size images, so the measured
    window never crosses an epoch boundary: the worker restart there would be
    charged to the loader, and real epochs are long enough to hide it.
    """
    if dry_run:
        s = ProofSettings("cpu", 3, 1, 4, "tiny", 2, 8, 1, True)
    else:
        s = ProofSettings("cuda", 200, 20, 256, "resnet50", 100, 0, None, False)
    s = replace(
        s,
        device=device or s.device,
        steps=steps or s.steps,
        batch_size=batch_size or s.batch_size,
        workers=s.workers if workers is None else workers,
    )
    if not dry_run:
        s = replace(s, per_class=math.ceil((s.warmup + s.steps) * s.batch_size / s.classes))
    return s


def _say(msg: str) -> None:
    print(f"[gpu_proof {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _make_sample(dest: Path, classes: int, per_class: int) -> Path:
    """make_sample_folder, one class per process (they touch no CUDA, so fork is safe)."""
    parts = dest.with_name(dest.name + ".parts")
    shutil.rmtree(parts, ignore_errors=True)
    procs = max(1, min(classes, pack_workers()))
    with ProcessPoolExecutor(procs) as pool:
        jobs = [
            pool.submit(make_sample_folder, parts / str(c), classes=1, per_class=per_class, seed=c)
            for c in range(classes)
        ]
        for job in jobs:
            job.result(timeout=900)
    dest.mkdir(parents=True)
    for c in range(classes):
        os.replace(parts / str(c) / "class_00", dest / f"class_{c:03d}")
    shutil.rmtree(parts)
    return dest


# --- the whole proof -------------------------------------------------------------


def _check(out: Path, src: Path | None, device: str) -> torch.device:
    if out.exists() and not out.is_dir():
        raise ProofError(f"{out}: expected an output folder, found a file")
    if src is not None and not src.is_dir():
        raise ProofError(f"{src}: expected a folder of class folders, found no folder")
    if device not in ("cuda", "cpu"):
        raise ProofError(f"device {device!r}: expected 'cuda' or 'cpu'")
    if device == "cuda" and not torch.cuda.is_available():
        raise ProofError(
            f"device cuda: expected a CUDA GPU, found none "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda})"
        )
    return torch.device(device)


def _sample_and_pack(root: Path, src: Path | None, s: ProofSettings):
    """(source folder, PackSummary): the given folder or a generated sample, packed at 224."""
    if src is None:
        src = root / "sample"
        if not src.is_dir():
            _say(f"sample: writing {s.classes} classes x {s.per_class} JPEGs under {src}")
            _make_sample(src, s.classes, s.per_class)
    shutil.rmtree(root / "pack", ignore_errors=True)
    (root / "pack").mkdir(parents=True)
    _say(f"pack: {src} -> {root / 'pack'} at {IMAGE_SIZE}x{IMAGE_SIZE}")
    workers = None if s.workers is None else max(1, s.workers)
    size = (IMAGE_SIZE, IMAGE_SIZE)
    return src, pack_folder(src, root / "pack" / "proof.bin", size=size, workers=workers,
                            progress=False)  # fmt: skip


def _describe(loader) -> dict:
    """How a loader was set up, for the record."""
    dl = getattr(loader, "dataloader", None) or loader
    return {
        "type": type(loader).__name__,
        "mode": getattr(loader, "mode", None),
        "num_workers": getattr(dl, "num_workers", None),
        "pin_memory": getattr(dl, "pin_memory", None),
    }


def _baseline(src: Path, s: ProofSettings):
    """The per-file PIL Dataset through the common DataLoader template."""
    return baseline_loader(PerFileImageDataset(src, size=IMAGE_SIZE), s.batch_size,
                           num_workers=s.workers)  # fmt: skip


def _imgpack(ds, s: ProofSettings, dev: torch.device, resident: bool = False):
    """imgpack's default loader (everything but the batch size and drop_last left default),
    or the pack held on the device whole (``resident=True``: no CPU in the loop)."""
    if resident:
        return make_loader(ds, s.batch_size, shuffle=True, drop_last=True, device=dev,
                           resident=True)  # fmt: skip
    return make_loader(ds, s.batch_size, shuffle=True, drop_last=True)


def run_proof(
    out: str | os.PathLike,
    *,
    src: str | os.PathLike | None = None,
    work: str | os.PathLike | None = None,
    dry_run: bool = False,
    device: str | None = None,
    steps: int | None = None,
    batch_size: int | None = None,
    workers: int | None = None,
) -> dict:
    """Run the proof, write OUT/gpu_proof.json and OUT/gpu_proof.png, return the JSON data.

    ``work`` keeps the sample folder and pack (a sample already there is reused);
    by default they live in a temporary folder that is removed.
    """
    s = settings_for(
        dry_run=dry_run, device=device, steps=steps, batch_size=batch_size, workers=workers
    )
    out, src = Path(out), (None if src is None else Path(src))
    dev = _check(out, src, s.device)
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    if dry_run:  # a tiny model gains nothing from threads, and on a shared CPU they thrash
        torch.set_num_threads(1)
    try:
        result = _run(out, src, work, s, dev)
    finally:
        torch.set_num_threads(threads)
    _write_json(result, out / "gpu_proof.json")
    write_chart(result, out / "gpu_proof.png")
    _say(
        f"wrote {out / 'gpu_proof.json'} and {out / 'gpu_proof.png'} in {result['elapsed_s']:.0f} s"
    )
    return result


def _run(
    out: Path, src: Path | None, work: str | os.PathLike | None, s: ProofSettings, dev
) -> dict:
    began = time.perf_counter()
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
    _say(f"ceilings: copying {s.batch_size}x3x{IMAGE_SIZE}x{IMAGE_SIZE} uint8 on {dev}")
    ceilings = measure_ceilings(s.batch_size, dev, repeats=3 if s.dry_run else 20)
    tmp = None if work is not None else tempfile.mkdtemp(prefix="gpu_proof-")
    root = Path(work if work is not None else tmp)
    try:
        generated = src is None
        src, packed = _sample_and_pack(root, src, s)
        num_classes = len(packed.index["classes"])
        if s.model == "resnet50":
            num_classes = max(num_classes, 1000)  # the standard 1000-way head: ~25.6M params
        build = resnet50 if s.model == "resnet50" else tiny_resnet
        ds = PackedImageDataset(packed.out_bin)
        transform = DeviceTransform.from_dataset(ds, flip=True)
        runs = {}
        for name in ("baseline", "imgpack", "imgpack resident"):
            if name == "baseline":
                loader = _baseline(src, s)
            else:
                loader = _imgpack(ds, s, dev, resident=name == "imgpack resident")
            _say(f"{name}: {s.warmup} warm-up + {s.steps} steps of {s.batch_size} ({s.model})")
            torch.manual_seed(0)  # the same initial weights for both loaders
            step = TrainStep(build(num_classes=num_classes), dev)
            runs[name] = time_training(
                loader, transform, step, warmup=s.warmup, steps=s.steps, ceilings=ceilings, log=_say
            )
            runs[name]["loader"] = _describe(loader)
            close = getattr(loader, "close", None)
            if callable(close):
                close()
            del loader, step
            gc.collect()  # stop this loader's workers before the next one starts
        ds.close()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    cuda = dev.type == "cuda"
    ratio = runs["imgpack"]["h2d"]["of_pinned_ceiling"]
    result = {
        "schema": 1,
        "dry_run": s.dry_run,
        "settings": {
            **asdict(s),
            "image_size": IMAGE_SIZE,
            "num_classes": num_classes,
            "src": str(src),
            "generated_sample": generated,
        },
        "machine": machine_facts(dev),
        "ceilings": ceilings,
        "pack": {
            "images": packed.count,
            "bytes": packed.bytes,
            "seconds": packed.seconds,
            "skipped": len(packed.skipped),
        },
        "loaders": runs,
        "targets": {
            "imgpack_wait_below_2pct": (runs["imgpack"]["data_wait_fraction"] < 0.02)
            if cuda
            else None,
            "h2d_at_least_80pct_of_pinned": None if ratio is None else ratio >= 0.8,
        },
        "elapsed_s": time.perf_counter() - began,
    }
    return result


def _write_json(data: dict, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--out", required=True, type=click.Path(path_type=Path), help="Folder for the JSON and PNG."
)
@click.option(
    "--src",
    type=click.Path(path_type=Path),
    help="Image folder SRC/<class>/<files> (default: a generated sample).",
)
@click.option(
    "--work",
    type=click.Path(path_type=Path),
    help="Keep the sample and pack here (default: a temp folder, removed).",
)
@click.option("--steps", type=click.IntRange(min=1), help="Measured steps per loader.")
@click.option("--batch-size", type=click.IntRange(min=1))
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    help="Workers of the per-file loader and the packer (default: each tool's own).",
)
@click.option(
    "--device", type=click.Choice(["cuda", "cpu"]), help="Default cuda (cpu with --dry-run)."
)
@click.option("--dry-run", is_flag=True, help="Tiny model, tiny sample, a few CPU steps.")
def main(out, src, work, steps, batch_size, workers, device, dry_run) -> None:
    """Train one model fed by the per-file loader and by imgpack; write OUT/gpu_proof.{json,png}."""
    try:
        result = run_proof(
            out,
            src=src,
            work=work,
            dry_run=dry_run,
            device=device,
            steps=steps,
            batch_size=batch_size,
            workers=workers,
        )
    except ImgpackError as exc:
        click.echo(f"gpu_proof: {exc}", err=True)
        sys.exit(1)
    for name, run in result["loaders"].items():
        util, h2d = run["gpu_util"]["mean_percent"], run["h2d"]["gbps"]
        click.echo(
            f"{name}: {run['images_per_s']:.0f} images/s, data wait "
            f"{run['data_wait_fraction']:.1%}, GPU util "
            + ("n/a" if util is None else f"{util:.0f}%")
            + ", host->device "
            + ("n/a" if h2d is None else f"{h2d:.1f} GB/s")
        )
