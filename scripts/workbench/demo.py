"""The main-job demo: the same simulated training, fed by per-file PIL decoding, then by imgpack.

``scripts/demo.sh`` makes a sample folder (``demo.py sample``), packs it with
``pack-images``, then runs ``demo.py train``; ``run_demo`` does all three in one
call (the test runs it at a tiny size).

The training step is simulated by sleeping ``step_ms`` per batch. A GPU step
leaves the host CPU free, and so does a sleep, so the loader gets the cores it
would get in real training; a CPU matmul would instead fight the loader for the
same cores and mostly measure this machine's core count. The default, 20 ms per
batch of 64 (3,200 images/s), is roughly a ResNet-50 training step on one
current data-centre GPU with mixed precision.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from imgpack.diagnose.meter import watch
from imgpack.diagnose.report import MeterSummary

__all__ = ["DemoResult", "train", "compare", "run_demo", "format_rows", "main"]

Out = Callable[[str], None]


class _Epochs:
    """``loader`` run for ``n`` epochs as one iterable, so the meter covers them all."""

    def __init__(self, loader: Any, n: int) -> None:
        self.loader, self.n = loader, n

    def __len__(self) -> int:
        return self.n * len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.n):
            yield from self.loader


def train(
    loader: Any, *, step_ms: float, epochs: int = 2, progress: bool | None = None
) -> MeterSummary:
    """Simulated training over ``loader`` with the starvation meter on; return its summary."""
    step_s = step_ms / 1000
    watched = watch(_Epochs(loader, epochs), log=lambda line: None, progress=progress)
    for _batch in watched:
        if step_s > 0:
            time.sleep(step_s)  # the "GPU step": the host CPU stays free, as on a real GPU
    return watched.summary()


@dataclass(frozen=True)
class DemoResult:
    baseline: MeterSummary
    imgpack: MeterSummary

    @property
    def speedup(self) -> float:
        return (self.imgpack.images_per_s or 0.0) / (self.baseline.images_per_s or float("inf"))


def format_rows(result: DemoResult, *, batch_size: int, step_ms: float) -> list[str]:
    """The side-by-side table and the speed-up line."""

    def row(name: str, s: MeterSummary) -> str:
        rate = f"{s.images_per_s:,.0f}" if s.images_per_s else "n/a"
        wait = f"{s.data_wait_fraction:.0%}" if s.data_wait_fraction is not None else "n/a"
        first = f"{s.first_batch_s:.2f} s" if s.first_batch_s is not None else "n/a"
        return f"{name:<34} {rate:>10} {wait:>10} {first:>12}"

    ceiling = batch_size / (step_ms / 1000) if step_ms > 0 else None
    lines = [
        f"simulated training: {step_ms:g} ms per batch of {batch_size}"
        + (f" (a GPU that could take {ceiling:,.0f} images/s)" if ceiling else ""),
        f"{'loader':<34} {'images/s':>10} {'data wait':>10} {'first batch':>12}",
        row("per-file PIL decode (DataLoader)", result.baseline),
        row("imgpack (make_loader)", result.imgpack),
        f"speed-up: {result.speedup:.1f}x images/s",
    ]
    b, i = result.baseline.data_wait_fraction, result.imgpack.data_wait_fraction
    if b is not None and i is not None:
        per_file, packed = f"{b:.0%} of the time with per-file decoding", f"{i:.0%} with imgpack"
        lines[-1] += f"; the GPU waits for data {per_file}, {packed}"
    return lines


def compare(
    src: str | os.PathLike,
    pack: str | os.PathLike,
    *,
    size: int = 224,
    batch_size: int = 64,
    step_ms: float = 20.0,
    epochs: int = 2,
    progress: bool | None = None,
    out: Out = print,
) -> DemoResult:
    """Train on ``src`` through the per-file template, then on ``pack`` through imgpack."""
    from imgpack.diagnose.measure import close_loader
    from imgpack.reader.dataset import PackedImageDataset
    from imgpack.reader.loader import make_loader
    from workbench.baseline import PerFileImageDataset, baseline_loader

    ds = PackedImageDataset(pack)  # a bad pack fails now, before the slow half runs
    out(f"training {epochs} epochs on per-file JPEGs ({src}) ...")
    loader = baseline_loader(PerFileImageDataset(src, size=size), batch_size)
    try:
        base = train(loader, step_ms=step_ms, epochs=epochs, progress=progress)
    finally:
        close_loader(loader)
    out(f"training {epochs} epochs on the pack ({pack}) ...")
    loader = make_loader(ds, batch_size)
    try:
        fast = train(loader, step_ms=step_ms, epochs=epochs, progress=progress)
    finally:
        close_loader(loader, ds)
    result = DemoResult(base, fast)
    for line in format_rows(result, batch_size=batch_size, step_ms=step_ms):
        out(line)
    return result


def run_demo(
    work_dir: str | os.PathLike,
    *,
    classes: int = 10,
    per_class: int = 100,
    size: int = 224,
    batch_size: int = 64,
    step_ms: float = 20.0,
    epochs: int = 2,
    progress: bool | None = None,
    out: Out = print,
) -> DemoResult:
    """Make a sample folder, pack it, and compare the two loaders: the whole demo in one call."""
    from imgpack.packer.pack import pack_folder
    from workbench.sample import make_sample_folder

    work = Path(work_dir)
    src, pack = work / "images", work / "train.bin"
    out(f"making {classes * per_class} sample JPEGs in {src} ...")
    make_sample_folder(src, classes=classes, per_class=per_class)
    summary = pack_folder(src, pack, size=(size, size), force=True, progress=progress)
    for line in summary.lines():
        out(line)
    return compare(
        src,
        pack,
        size=size,
        batch_size=batch_size,
        step_ms=step_ms,
        epochs=epochs,
        progress=progress,
        out=out,
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """The imgpack demo (run scripts/demo.sh for all of it)."""


@main.command("sample")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option("--classes", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--per-class", type=click.IntRange(min=1), default=100, show_default=True)
def sample_command(dest: Path, classes: int, per_class: int) -> None:
    """Write an ImageNet-like folder DEST/<class>/<n>.jpg cut from photographs on disk."""
    from workbench.sample import make_sample_folder

    t0 = time.perf_counter()
    make_sample_folder(dest, classes=classes, per_class=per_class)
    click.echo(f"made {classes * per_class} JPEGs in {dest} ({time.perf_counter() - t0:.1f} s)")


@main.command("train")
@click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("pack", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--size",
    type=click.IntRange(min=8),
    default=224,
    show_default=True,
    help="What the per-file loader resizes to (the pack's own size).",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True)
@click.option(
    "--step-ms",
    type=click.FloatRange(min=0),
    default=20.0,
    show_default=True,
    help="Simulated GPU step per batch (a sleep: the CPU stays free).",
)
@click.option("--epochs", type=click.IntRange(min=1), default=2, show_default=True)
def train_command(
    src: Path, pack: Path, size: int, batch_size: int, step_ms: float, epochs: int
) -> None:
    """Simulated training on SRC (per-file PIL decoding) and on PACK (imgpack), side by side."""
    from imgpack.errors import ImgpackError

    try:
        compare(src, pack, size=size, batch_size=batch_size, step_ms=step_ms, epochs=epochs)
    except ImgpackError as exc:
        click.echo(f"demo: error: {exc}", err=True)
        sys.exit(1)
