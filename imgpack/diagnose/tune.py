"""``pack-images tune PACK``: measure the loader settings on this machine, print the best call.

Sweeps the in-process path and num_workers x prefetch_factor (x pin_memory where
CUDA exists) within a time budget, each config with repeats and medians, for the
user's batch size and an optional training step simulated by sleeping
``--step-ms`` per batch. It sleeps rather than spins because a GPU step leaves
the host CPU free for the loader, and a busy-wait would compete with the
workers for cores the real run leaves them. What to conclude from the numbers
is ``advise.decide``; this module only measures. torch is imported inside the
functions, so that ``pack-images`` starts without it.

A repeat is a window of batches timed by the meter. A cold measurement drops the pack's
pages with ``posix_fadvise(DONTNEED)`` first (no root needed); pages still mapped by a
live process cannot be dropped, so a loader and its dataset are closed before. Private
memory is read over the process and its workers as each window ends; the table shows the
most.

What it asks of the reader: ``PackedImageDataset(pack, prefault=...)`` and its ``shape``,
``codec``, ``record_sizes`` and ``paths``; ``make_loader`` with the keywords a user passes;
``loader.close()``.
"""

from __future__ import annotations

import contextlib
import gc
import glob
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import click

from imgpack.console import debug_option, one_line, reporting
from imgpack.diagnose import advise
from imgpack.diagnose.meter import watch
from imgpack.diagnose.plot import plot_sweep, pyplot
from imgpack.machine import mem_available, usable_cores

__all__ = ["tune", "tune_command"]

MIN_WINDOW_BATCHES = 3  # a repeat covers at least this many batches, whatever the budget


def drop_cache(path: str | os.PathLike) -> None:
    """Ask the kernel to forget ``path``'s cached pages (nothing where the platform cannot)."""
    if hasattr(os, "posix_fadvise"):
        with open(path, "rb") as f:
            os.fsync(f.fileno())  # dirty pages are never dropped; a finished pack has none
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def batches_forever(loader: Iterable) -> Iterator[Any]:
    """Batches epoch after epoch (with persistent workers the seam is cheap)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("loader yields no batches (fewer images than one batch?)")


def window(
    batches: Iterator[Any], *, seconds: float, min_batches: int = 1, step_s: float = 0.0
) -> tuple[float, float]:
    """Batches for ``seconds`` (at least ``min_batches``), "training" ``step_s`` on each,
    through the meter; (images/s, the share of the time spent waiting), first batch included.

    The step sleeps rather than spins: a GPU step leaves the host CPU free for the
    loader's workers, and a busy-wait would steal a core from them.
    """
    end = time.perf_counter() + seconds
    watched = watch(batches, log=lambda line: None, progress=False)
    for n, _ in enumerate(watched, 1):
        time.sleep(step_s)
        if n >= min_batches and time.perf_counter() >= end:
            break  # ``batches`` goes on: the next window continues it
    s = watched.summary()
    took = s.seconds + s.first_batch_s
    return (s.images + s.first_batch_images) / took, (s.wait_s + s.first_batch_s) / took


def _private(pid: int) -> int:
    """Private bytes of ``pid`` and its descendants (the loader's workers), summed, from
    Linux's /proc: each one's ``smaps_rollup``, and each thread's ``children``. An error
    (OSError, KeyError, ValueError) where /proc does not say (another system, an old kernel).

    Private is anonymous + shared-memory PSS: PSS splits a page shared by k processes k
    ways, so the sum counts each page once, and file pages (the mapped pack, the
    libraries) are left out because the page cache holds them for everyone. (RSS would
    count a page shared by forked workers, and the mapped pack, once per process.)
    """
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
        kb = dict(line.split(":", 1) for line in f)
    total = (int(kb["Pss_Anon"].split()[0]) + int(kb["Pss_Shmem"].split()[0])) << 10
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        # a thread or a child that ended meanwhile (a zombie's smaps_rollup cannot be read)
        with contextlib.suppress(OSError, KeyError, ValueError):
            for child in Path(path).read_text(encoding="ascii").split():
                total += _private(int(child))
    return total


def _as_gathered(images, records):
    """tune's ``transform=`` for a pack of many record sizes (make_loader needs one): the
    batch as gathered, so that the loader alone is measured."""
    return images


def _varying(ds) -> bool:
    """Whether some record is smaller than the pack's bound (``--resize fit``)."""
    h, w, _ = ds.shape
    return bool((ds.record_sizes != (w, h)).any())


def measure(
    pack: str | os.PathLike, config: advise.Config, sweep: advise.Sweep, seconds: float
) -> advise.Measured:
    """Images/s of ``config`` in ``repeats`` windows that together take about ``seconds``.

    Warm: one loader; skip as many batches as it can hold in flight (so the windows see
    the steady state, not a queue filled while it started), then time the windows back to
    back. Cold: for each window, drop the pack's pages, make a fresh loader (prefault off:
    reads come from disk as in training) and time from its start.
    """
    import imgpack

    step_s, cold, end = sweep.step_ms / 1000, sweep.cold, time.perf_counter() + seconds
    timed, peak = [], None  # (images/s, wait share) per window; private bytes
    held = contextlib.ExitStack()  # the dataset, its loader, its batches
    try:
        with held, warnings.catch_warnings():
            # tune tries more workers than cores on purpose; the table says how they did
            warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
            for r in range(sweep.repeats):
                if cold or r == 0:
                    held.close()
                    if cold:
                        gc.collect()  # the kernel drops no page a live map still holds
                    # cold: reads come from disk, as in training (no prefault)
                    ds = imgpack.PackedImageDataset(pack, **({"prefault": False} if cold else {}))
                    held.enter_context(ds)
                    kw = {"transform": _as_gathered} if _varying(ds) else {}
                    loader = imgpack.make_loader(
                        ds, sweep.batch_size, seed=0, order=sweep.order, **config.kwargs(), **kw
                    )
                    batches = batches_forever(held.enter_context(loader))
                    held.callback(batches.close)
                    if cold:
                        for ix in ds.indexes:
                            drop_cache(ix.data_path)
                    else:  # the batches a loader holds in flight were made while it started
                        window(batches, seconds=0, min_batches=config.buffers + 1, step_s=step_s)
                left = max(0.0, end - time.perf_counter()) / (sweep.repeats - r)
                timed.append(
                    window(batches, seconds=left, min_batches=MIN_WINDOW_BATCHES, step_s=step_s)
                )
                # memory as each window ends, the loader at its steady state: sampled here,
                # not by a thread of this process, which would compete with the loader's
                with contextlib.suppress(OSError, KeyError, ValueError):  # /proc does not say
                    peak = max(peak or 0, _private(os.getpid()))
    except (RuntimeError, OSError, MemoryError) as exc:  # one config failing must not end the sweep
        return advise.Measured(config, None, error=one_line(exc))
    rates, waits = zip(*timed)
    return advise.Measured(config, advise.Stat.of(rates), statistics.median_high(waits), peak)


def tune(
    pack: str | os.PathLike,
    sweep: advise.Sweep,
    *,
    budget_s: float,
    workers: Sequence[int],
    prefetch: Sequence[int],
    plot: str | os.PathLike | None,
) -> str:
    """Sweep, decide, optionally plot; return the report text (progress goes to stderr).

    Each config gets an equal share of what is left of the budget, so every one
    is measured unless starting them alone eats the budget (those are listed).
    """
    import torch

    import imgpack

    with imgpack.PackedImageDataset(pack) as ds:  # a bad pack fails here, before any time
        shape, codec, varying = tuple(ds.shape), ds.codec, _varying(ds)
        pack_bytes = sum(os.path.getsize(ix.data_path) for ix in ds.indexes)
    if plot is not None:
        pyplot()  # and so does a missing matplotlib
    configs = advise.sweep_configs(
        cuda=torch.cuda.is_available(), workers=workers, prefetch=prefetch
    )
    t0, measured, skipped = time.perf_counter(), [], []
    for i, config in enumerate(configs):
        left = budget_s - (time.perf_counter() - t0)
        if left <= 0:
            skipped = configs[i:]
            break
        m = measure(pack, config, sweep, left / (len(configs) - i))
        measured.append(m)
        done = m.error or f"{m.rates.median:,.0f} images/s"
        click.echo(f"[{i + 1}/{len(configs)}] {config.label}: {done}", err=True)
    cores, mem = usable_cores() or 1, mem_available()
    verdict = advise.decide(
        measured, sweep, shape=shape, cores=cores, pack_bytes=pack_bytes, mem_available=mem
    )
    if plot is not None:
        step = f", step {sweep.step_ms:g} ms" if sweep.step_ms else ""
        cache = "cold" if sweep.cold else "warm"
        title = f"pack-images tune: batch {sweep.batch_size}{step}, {cache} cache"
        plot_sweep([m for m in measured if m.error is None], plot, title=title)
    # a batch is gathered into (H, W, C) uint8 slots, whatever the codec
    report = advise.format_report(
        measured, verdict, sweep, record_bytes=math.prod(shape), skipped=skipped
    )
    return "\n".join([report, *advise.pack_notes(codec, varying)])


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


@click.command("tune", context_settings={"show_default": True})
@click.argument("pack", metavar="PACK", type=click.Path(dir_okay=False))
@click.option("--batch-size", type=click.IntRange(min=1), default=256)
@click.option(
    "--step-ms",
    type=click.FloatRange(min=0),
    default=0.0,
    help="Simulated training step per batch (sleeps, like a GPU step leaves the CPU free).",
)
@click.option("--budget-s", type=click.FloatRange(min=1), default=60.0, help="Time for the sweep.")
@click.option("--repeats", type=click.IntRange(min=1), default=3)
@click.option("--cold", is_flag=True, help="Drop the pack's cached pages before every repeat.")
@click.option("--order", type=click.Choice(["uniform", "block"]), default="uniform")
@click.option("--workers", default="0,1,2,4", callback=_int_list(0), help="num_workers to try.")
@click.option("--prefetch", default="2,4,8", callback=_int_list(1), help="prefetch_factor to try.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), help="A PNG bar chart.")
@debug_option
def tune_command(pack, batch_size, step_ms, repeats, cold, order, debug, **options) -> None:
    """Find the fastest loader settings for PACK on this machine.

    Prints a table (images/s, data-wait share, peak memory per config), the
    winner as the exact make_loader(...) call, and whether it keeps up with
    --step-ms.
    """
    with reporting(debug):
        sweep = advise.Sweep(batch_size, step_ms, order, cold, repeats)
        click.echo(tune(pack, sweep, **options))
        if options["plot"] is not None:
            click.echo(f"plot: {options['plot']}")
