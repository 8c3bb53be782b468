"""``pack-images tune PACK``: measure the loader settings on this machine, print the best call.

Sweeps the in-process path and num_workers x prefetch_factor (x pin_memory where
CUDA exists) within a time budget, each config with repeats and medians, for the
user's batch size and an optional training step simulated by sleeping
``--step-ms`` per batch. It sleeps rather than spins because a GPU step leaves
the host CPU free for the loader, and a busy-wait would compete with the
workers for cores the real run leaves them. What to conclude from the numbers
is ``advise.decide``; this module only measures. torch is imported inside the
functions, so that ``pack-images`` starts without it.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import click

from imgpack.console import debug_option, reporting
from imgpack.diagnose.advise import (
    Config,
    Measured,
    TuneResult,
    decide,
    format_report,
    pack_notes,
    sweep_configs,
)
from imgpack.diagnose.measure import (
    PeakMemory,
    close_loader,
    cycle_batches,
    drop_cache,
    stat,
    time_window,
)
from imgpack.diagnose.plot import plot_sweep, pyplot
from imgpack.machine import mem_available, usable_cores

__all__ = ["measure", "tune", "tune_command", "MIN_WINDOW_BATCHES"]

MIN_WINDOW_BATCHES = 3  # a repeat covers at least this many batches, whatever the budget


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _as_gathered(images, records):
    """tune's ``transform=`` for a pack of many record sizes (make_loader needs one): the
    batch as gathered, so that the loader alone is measured."""
    return images


def _varying(pack) -> bool:
    """Whether some record of a pack (an index or a dataset) is smaller than its bound."""
    h, w, _ = pack.shape
    return bool((pack.record_sizes != (w, h)).any())


def measure(*args, **kwargs) -> Measured:
    """Images/s of one config (see ``_measure``), without torch's "more workers than
    cores" warning: tune tries such configs on purpose, and the table says how they did.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="This DataLoader will create", category=UserWarning
        )
        return _measure(*args, **kwargs)


def _measure(
    pack: str | os.PathLike,
    config: Config,
    *,
    batch_size: int,
    seconds: float,
    repeats: int = 3,
    step_ms: float = 0.0,
    order: str = "uniform",
    cold: bool = False,
    seed: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> Measured:
    """Images/s of ``config`` in ``repeats`` windows that together take about ``seconds``.

    Warm: one loader; skip as many batches as it can hold in flight (so the
    windows see the steady state, not a queue filled while it started), then
    time the windows back to back. Cold: for each window, drop the pack's pages,
    make a fresh loader (prefault off: reads come from disk as in training) and
    time from its start.
    """
    from imgpack.reader.dataset import PackedImageDataset
    from imgpack.reader.loader import make_loader

    step_s = step_ms / 1000
    rates, waits = [], []

    def extra(ds: PackedImageDataset) -> dict:
        return {"transform": _as_gathered} if _varying(ds) else {}

    t_start = clock()

    def window(it, budget: float, *, skip: int = 0) -> None:
        if skip:
            time_window(it, skip, step_s=step_s, clock=clock)
        n, s, w = time_window(
            it, seconds=budget, min_batches=MIN_WINDOW_BATCHES, step_s=step_s, clock=clock
        )
        rates.append(n / s)
        waits.append(w / s)

    try:
        with PeakMemory() as mem:
            if not cold:
                ds = PackedImageDataset(pack)
                kw = {**config.kwargs(), **extra(ds)}
                loader = make_loader(ds, batch_size, seed=seed, order=order, **kw)
                it = cycle_batches(loader)
                try:
                    time_window(it, config.buffers + 1, step_s=step_s, clock=clock)
                    left = max(0.0, seconds - (clock() - t_start))
                    for _ in range(repeats):
                        window(it, left / repeats)
                finally:
                    it.close()
                    close_loader(loader, ds)
            else:
                for r in range(repeats):
                    ds = PackedImageDataset(pack, prefault=False)
                    kw = {**config.kwargs(), **extra(ds)}
                    loader = make_loader(ds, batch_size, seed=seed, order=order, **kw)
                    it = cycle_batches(loader)
                    try:
                        for path in ds.paths:
                            drop_cache(path)
                        left = max(0.0, seconds - (clock() - t_start))
                        window(it, left / (repeats - r))
                    finally:
                        it.close()
                        close_loader(loader, ds)
    except (RuntimeError, OSError, MemoryError) as exc:  # one config failing must not end the sweep
        return Measured(config, stat([]), error=" ".join(str(exc).split()) or type(exc).__name__)
    waits.sort()
    return Measured(
        config,
        stat(rates),
        wait_fraction=waits[len(waits) // 2],
        peak_rss=mem.peak_rss,
        peak_private=mem.peak_private,
    )


def tune(
    pack: str | os.PathLike,
    *,
    batch_size: int = 256,
    step_ms: float = 0.0,
    budget_s: float = 60.0,
    repeats: int = 3,
    cold: bool = False,
    order: str = "uniform",
    workers: Sequence[int] = (0, 1, 2, 4),
    prefetch: Sequence[int] = (2, 4, 8),
    plot: str | os.PathLike | None = None,
    log: Callable[[str], None] | None = _stderr,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[TuneResult, str]:
    """Sweep, decide, optionally plot; return the result and the report text.

    Each config gets an equal share of what is left of the budget, so every one
    is measured unless starting them alone eats the budget (those are listed).
    """
    import torch

    from imgpack.reader.canvas import slot_shape
    from imgpack.reader.dataset import PackedImageDataset

    with PackedImageDataset(pack) as ds:  # a bad pack (or manifest) fails here, before any time
        shape, codec, varying = tuple(ds.shape), ds.codec, _varying(ds)
        pack_bytes = sum(ix.data_file_bytes for ix in ds.indexes)
    if plot is not None:
        pyplot()  # and so does a missing matplotlib
    configs = sweep_configs(cuda=torch.cuda.is_available(), workers=workers, prefetch=prefetch)
    t0 = clock()
    measured: list[Measured] = []
    skipped: list[Config] = []
    for i, config in enumerate(configs):
        left = budget_s - (clock() - t0)
        if left <= 0:
            skipped = configs[i:]
            break
        m = measure(
            pack,
            config,
            batch_size=batch_size,
            seconds=left / (len(configs) - i),
            repeats=repeats,
            step_ms=step_ms,
            order=order,
            cold=cold,
            clock=clock,
        )
        measured.append(m)
        if log is not None:
            got = m.error or f"{m.rates.median:,.0f} images/s"
            log(f"[{i + 1}/{len(configs)}] {config.label}: {got}")
    cores = usable_cores()
    verdict = decide(
        measured,
        batch_size=batch_size,
        step_ms=step_ms,
        shape=shape,
        cores=cores or 1,
        cold=cold,
        order=order,
        pack_bytes=pack_bytes,
        mem_available=mem_available(),
    )
    result = TuneResult(measured, verdict, skipped, batch_size, step_ms, order, clock() - t0)
    if plot is not None:
        points = [
            {
                "label": m.config.label,
                "row": m.config.row,
                "prefetch_factor": m.config.prefetch_factor,
                "images_per_s": m.rates.median,
                "min": m.rates.min,
                "max": m.rates.max,
            }
            for m in measured
            if m.error is None
        ]
        step = f", step {step_ms:g} ms" if step_ms else ""
        title = f"pack-images tune: batch {batch_size}{step}, {'cold' if cold else 'warm'} cache"
        plot_sweep(points, plot, title=title)
    # what one batch buffer holds per image: the canvas (the bound; yuv420: 1.5 bytes a pixel)
    slot = math.prod(slot_shape(codec, shape))
    report = format_report(result, record_bytes=slot)
    return result, "\n".join([report, *pack_notes(codec, varying)])


def _int_list(minimum: int) -> Callable:
    def parse(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
        try:
            out = tuple(int(v) for v in value.split(",") if v.strip())
        except ValueError:
            out = ()
        if not out or min(out) < minimum:
            raise click.BadParameter(
                f"expected comma-separated integers >= {minimum}, found {value!r}"
            )
        return out

    return parse


@click.command("tune")
@click.argument("pack", metavar="PACK", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True)
@click.option(
    "--step-ms",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Simulated training step per batch (sleeps, like a GPU step leaves the CPU free).",
)
@click.option(
    "--budget-s",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Time for the whole sweep.",
)
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--cold", is_flag=True, help="Drop the pack's cached pages before every repeat.")
@click.option(
    "--order",
    type=click.Choice(["uniform", "block"]),
    default="uniform",
    show_default=True,
)
@click.option(
    "--workers",
    default="0,1,2,4",
    show_default=True,
    callback=_int_list(0),
    help="num_workers values to try.",
)
@click.option(
    "--prefetch",
    default="2,4,8",
    show_default=True,
    callback=_int_list(1),
    help="prefetch_factor values to try.",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write a PNG heatmap here.",
)
@debug_option
def tune_command(
    pack: Path,
    batch_size: int,
    step_ms: float,
    budget_s: float,
    repeats: int,
    cold: bool,
    order: str,
    workers: tuple[int, ...],
    prefetch: tuple[int, ...],
    plot: Path | None,
    debug: bool,
) -> None:
    """Find the fastest loader settings for PACK on this machine.

    Prints a table (images/s, data-wait share, peak memory per config), the
    winner as the exact make_loader(...) call, and whether it keeps up with
    --step-ms.
    """

    with reporting(debug):
        _, text = tune(
            pack,
            batch_size=batch_size,
            step_ms=step_ms,
            budget_s=budget_s,
            repeats=repeats,
            cold=cold,
            order=order,
            workers=workers,
            prefetch=prefetch,
            plot=plot,
        )
        click.echo(text)
        if plot is not None:
            click.echo(f"heatmap: {plot}")
