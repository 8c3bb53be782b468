"""``pack-images tune PACK``: measure the loader settings on this machine, print the best call.

Sweeps the in-process path and num_workers x prefetch_factor (x pin_memory where
CUDA exists) within a time budget, each config with repeats and medians, for the
user's batch size and an optional training step simulated by sleeping
``--step-ms`` per batch. It sleeps rather than spins because a GPU step leaves
the host CPU free for the loader, and a busy-wait would compete with the
workers for cores the real run leaves them. What to conclude from the numbers
is ``decide``, a pure function with no clock (``format_report`` prints it), so that tests
feed it made-up numbers; ``tune --plot`` draws the sweep with matplotlib (the ``plot`` extra,
imported on the Agg backend only when asked for, so it works with no display). torch is
imported inside the functions, so that ``pack-images`` and the advice start without it.

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
import itertools
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import click

from imgpack.console import debug_option, one_line, reporting
from imgpack.diagnose.meter import watch
from imgpack.errors import InvalidArgumentError, MissingExtraError
from imgpack.machine import mem_available, usable_cores

__all__ = ["tune", "tune_command", "sweep_configs", "decide", "format_report"]


MIN_WINDOW_BATCHES = 3  # a repeat covers at least this many batches, whatever the budget
_NOISE = 0.03  # medians closer than this, relative, are a tie
_KEEPUP_SLACK = 0.05  # a config "keeps up" when it delivers >= 95% of what the step consumes


class Stat(NamedTuple):
    """Repeated measurements of one quantity (at least one): report the median, show the
    spread."""

    median: float
    min: float
    max: float

    @classmethod
    def of(cls, samples: Iterable[float]) -> Stat:
        s = [float(x) for x in samples]
        return cls(statistics.median(s), min(s), max(s))

    def ties(self, other: Stat) -> bool:
        """Whether the two are within noise: min-max ranges overlap or medians < 3% apart."""
        close = abs(self.median - other.median) <= _NOISE * max(self.median, other.median)
        return close or (self.min <= other.max and other.min <= self.max)


@dataclass(frozen=True)
class Sweep:
    """What tune was asked to measure: the user's batch and step, the order, warm or cold
    (the defaults live in one place: ``pack-images tune``'s options)."""

    batch_size: int
    step_ms: float  # the training step simulated per batch (0: none)
    order: str
    cold: bool
    repeats: int

    @property
    def needed(self) -> float | None:
        """Images/s the step consumes, None without a step."""
        return self.batch_size / (self.step_ms / 1000) if self.step_ms > 0 else None


@dataclass(frozen=True)
class Config:
    """One loader configuration; ``kwargs()`` is exactly what goes to make_loader."""

    mode: str  # "workers" or "inprocess"
    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    gather_threads: int | None = None  # in-process: threads per batch (None: make_loader's default)

    @property
    def label(self) -> str:
        threads = "" if self.gather_threads is None else f" threads={self.gather_threads}"
        name = "in-process" + threads if self.mode == "inprocess" else f"workers={self.num_workers}"
        if self.prefetch_factor is not None:
            name += f" prefetch={self.prefetch_factor}"
        return name + (" pin" if self.pin_memory else "")

    @property
    def buffers(self) -> int:
        """Batch-sized buffers alive at once; memory is this x the batch's bytes."""
        p = self.prefetch_factor or 0
        if self.mode == "inprocess":
            return (p or 2) + 4  # ahead + being gathered + the one held + the one before + spare
        return self.num_workers * p + 1  # in flight from workers + the one in the loop

    def _options(self) -> tuple[dict[str, Any], str, dict[str, Any]]:
        """make_loader's keywords but ``options`` and ``pin_memory``, then the options class
        it takes ("" for none) and that class's fields: one recipe for ``kwargs`` and ``call``."""
        if self.mode == "inprocess":
            fields = {"prefetch": self.prefetch_factor, "gather_threads": self.gather_threads}
            return {}, "InProcessOptions", {k: v for k, v in fields.items() if v is not None}
        fields = {} if self.prefetch_factor is None else {"prefetch_factor": self.prefetch_factor}
        return {"num_workers": self.num_workers}, "WorkerOptions" if fields else "", fields

    def kwargs(self) -> dict[str, Any]:
        # The reader's option classes; importing the reader imports torch. Only this method
        # and the measuring below do, so deciding on and printing the advice need no torch.
        import imgpack

        top, kind, fields = self._options()
        options = {"options": getattr(imgpack, kind)(**fields)} if kind else {}
        return {**top, **options, "pin_memory": self.pin_memory}

    def call(self, batch_size: int, order: str = "uniform") -> str:
        top, kind, fields = self._options()
        args = ["ds", str(batch_size), *(f"{k}={v!r}" for k, v in top.items())]
        if kind:
            args.append(f"options={kind}({', '.join(f'{k}={v!r}' for k, v in fields.items())})")
        args.append(f"pin_memory={self.pin_memory!r}")
        args += [f'order="{order}"'] if order != "uniform" else []
        return f"make_loader({', '.join(args)})"


@dataclass
class Measured:
    """What one config did: images/s per repeat, the share of time spent waiting, memory."""

    config: Config
    rates: Stat | None  # None where it failed (``error``)
    wait_fraction: float | None = None
    peak_private: int | None = None  # bytes: anonymous + shm PSS, shared pages counted once
    error: str | None = None


@dataclass
class Verdict:
    fastest: Measured
    recommended: Measured
    ties: list[Measured]  # other configs within noise of the fastest
    keeps_up: bool | None  # None without a step
    advice: list[str]


def sweep_configs(
    *,
    cuda: bool,
    workers: Sequence[int],
    prefetch: Sequence[int],
    threads: Sequence[int] = (1, 2),
) -> list[Config]:
    """The configs to try, fewest processes first, so a budget that runs out cuts the costliest.

    ``workers`` 0 means the DataLoader in the main process; the in-process path comes
    first: read in the loop's own thread (``prefetch=0``), then a background thread with
    each count of gather ``threads``. pin_memory is tried both ways only where CUDA exists.
    """
    pins = (False, True) if cuda else (False,)
    prefetch = sorted(set(prefetch) - {0})
    configs = [Config("inprocess", 0, 0, pin, 1) for pin in pins]
    for t, pf, pin in itertools.product(sorted(set(threads)), prefetch, pins):
        configs.append(Config("inprocess", 0, pf, pin, t))
    for w in sorted(set(workers)):
        for pf, pin in itertools.product([None] if w == 0 else prefetch, pins):
            configs.append(Config("workers", w, pf, pin))
    return configs


def decide(
    measured: Sequence[Measured],
    sweep: Sweep,
    *,
    shape: tuple[int, int, int],
    cores: int,
    pack_bytes: int = 0,
    mem_available: int | None = None,
) -> Verdict | None:
    """Pick the fastest, the cheapest config within noise of it, and say what falls short."""
    ok = [m for m in measured if m.error is None]
    if not ok:
        return None
    fastest = max(ok, key=lambda m: m.rates.median)
    ties = [m for m in ok if m is not fastest and m.rates.ties(fastest.rates)]
    # Among equals, less memory in flight and fewer processes leave more for training.
    recommended = min(
        [fastest, *ties],
        key=lambda m: (m.config.buffers, m.config.num_workers, m.config.pin_memory),
    )
    needed, keeps_up, advice = sweep.needed, None, []
    big = mem_available is not None and pack_bytes > mem_available
    if needed is not None:
        keeps_up = fastest.rates.median >= needed * (1 - _KEEPUP_SLACK) or (
            fastest.wait_fraction is not None and fastest.wait_fraction <= _KEEPUP_SLACK
        )
    if keeps_up is False:
        short = needed / fastest.rates.median
        h, w, _ = shape
        side = max(8, int(min(h, w) / math.sqrt(short)) // 8 * 8)
        advice.append(
            f"more cores: {cores} here; loading scales about linearly with cores until memory "
            f"bandwidth, so roughly {math.ceil(cores * short)} would keep up"
        )
        advice.append(
            f"a smaller stored size: bytes per image fall with the square of the side; "
            f"re-pack with --size {side} (now {w}x{h}) to need {short:.1f}x fewer bytes"
        )
    if sweep.order != "block" and (sweep.cold or big or keeps_up is False):
        where = "if the pack will not stay in the page cache during training (measure with --cold)"
        if sweep.cold:
            where = "the pack was measured cold (--cold)"
        if big:
            where = "the pack is larger than available memory"
        advice.append(
            f'{where}: use order="block" so that reads stay near-sequential instead of one '
            "random record per read"
        )
    return Verdict(fastest, recommended, ties, keeps_up, advice)


def _mb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.0f}"


def format_report(
    measured: Sequence[Measured],
    v: Verdict | None,
    sweep: Sweep,
    *,
    record_bytes: int,
    skipped: Sequence[Config] = (),
) -> str:
    """The table and the verdict ``v`` as plain text, the way ``pack-images tune`` prints them.

    ``record_bytes``: what one image takes in a batch buffer (its canvas slot), for the
    memory of the batches in flight; ``skipped``: the configs the budget left unmeasured."""
    bs, needed = sweep.batch_size, sweep.needed
    wide = max([len("config"), *(len(m.config.label) for m in measured)])
    row = f"{{:<{wide}}} {{:>10}} {{:>17}} {{:>6}} {{:>10}} {{:>10}}"  # the columns, then marks
    lines = [row.format("config", "images/s", "min-max", "wait", "private MB", "batches MB")]
    for m in measured:
        if m.error is not None:  # (v is None only where every config failed)
            lines.append(f"{m.config.label:<{wide}} failed: {m.error}")
            continue
        mark = "*" if m is v.fastest else "=" if m in v.ties else ""
        mark += " <- recommended" if m is v.recommended else ""
        r = m.rates
        wait = "n/a" if m.wait_fraction is None else f"{100 * m.wait_fraction:.0f}%"
        memory = (_mb(m.peak_private), _mb(m.config.buffers * bs * record_bytes))
        numbers = (f"{r.median:,.0f}", f"{r.min:,.0f}-{r.max:,.0f}", wait, *memory)
        lines.append(row.format(m.config.label, *numbers) + f"  {mark}")
    lines.append("(* fastest, = within noise of it: ranges overlap or medians < 3% apart)")
    lines += [f"not measured (budget spent): {c.label}" for c in skipped]
    if v is None:
        return "\n".join([*lines, "no configuration could be measured"])
    lines += ["", f"fastest: {v.fastest.config.label} at {v.fastest.rates.median:,.0f} images/s"]
    lines.append(f"recommended: {v.recommended.config.call(bs, sweep.order)}")
    if needed is None:
        lines.append("no --step-ms given: these are raw loader speeds with no training step")
    else:
        step = f"a {sweep.step_ms:g} ms step on {bs} images consumes {needed:,.0f} images/s"
        best = f"the best here gives {v.fastest.rates.median:,.0f}; the GPU will wait for data"
        short = f"NO configuration keeps up: {step}, {best}. What would help:"
        lines.append(f"keeps up: {step} and the loader delivers it" if v.keeps_up else short)
    lines += [f"  - {a}" for a in v.advice]
    return "\n".join(lines)


def pyplot():
    """matplotlib.pyplot on the Agg backend, or a clear error when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtraError(
            "plotting needs matplotlib, which is not installed (pip install imgpack[plot])"
        ) from None
    return plt


def plot_sweep(measured: list[Any], path: str | os.PathLike, sweep: Sweep) -> None:
    """Every config that ran (``Measured``) as a bar: images/s, median, with the
    min-max of its repeats, in the order of the table ``tune`` prints; titled by ``sweep``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, max(3.0, 0.32 * len(measured) + 1.5)))
    rates, y = [m.rates for m in measured], range(len(measured))
    spread = [[r.median - r.min for r in rates], [r.max - r.median for r in rates]]
    ax.barh(y, [r.median for r in rates], xerr=spread if rates else None, capsize=3)
    ax.set_yticks(y, [m.config.label for m in measured], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("images/s (median, bars min–max)")
    step = f", step {sweep.step_ms:g} ms" if sweep.step_ms else ""
    cache = "cold" if sweep.cold else "warm"
    ax.set_title(f"pack-images tune: batch {sweep.batch_size}{step}, {cache} cache")
    fig.tight_layout()
    tmp = Path(path).with_name(f".{Path(path).name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def drop_cache(path: str | os.PathLike) -> None:
    """Ask the kernel to forget ``path``'s cached pages (nothing where the platform cannot)."""
    if hasattr(os, "posix_fadvise"):
        with open(path, "rb") as f:
            os.fsync(f.fileno())  # dirty pages are never dropped; a finished pack has none
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def batches_forever(loader: Iterable) -> Iterator[Any]:
    """Batches epoch after epoch (with persistent workers the seam is cheap). Every epoch
    gives one at least: make_loader refuses a dataset of no records, and tune's loaders keep
    the last partial batch (``drop_last=False``)."""
    while True:
        yield from loader


def window(
    batches: Iterator[Any], *, seconds: float, step_s: float, min_batches: int = MIN_WINDOW_BATCHES
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
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        # a thread or a child that ended meanwhile (a zombie's smaps_rollup cannot be read)
        with contextlib.suppress(OSError, KeyError, ValueError):
            for child in path.read_text(encoding="ascii").split():
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


def measure(pack: str | os.PathLike, config: Config, sweep: Sweep, seconds: float) -> Measured:
    """Images/s of ``config`` in ``repeats`` windows that together take about ``seconds``.

    Warm: one loader; skip as many batches as it can hold in flight (so the windows see
    the steady state, not a queue filled while it started), then time the windows back to
    back. Cold: for each window, drop the pack's pages, make a fresh loader (prefault off:
    reads come from disk as in training) and time from its start.
    """
    import imgpack

    step_s, cold, end = sweep.step_ms / 1000, sweep.cold, time.perf_counter() + seconds
    timed, peak = [], None  # (images/s, wait share) per window; private bytes
    try:  # ``held``: the dataset, its loader, its batches
        with contextlib.ExitStack() as held, warnings.catch_warnings():
            # tune tries more workers than cores on purpose; the table says how they did
            warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
            for r in range(sweep.repeats):
                if cold or r == 0:
                    held.close()
                    gc.collect()  # cold: the kernel drops no page a live map still holds
                    # cold: reads come from disk, as in training (no prefault)
                    ds = imgpack.PackedImageDataset(pack, prefault=False if cold else None)
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
                timed.append(window(batches, seconds=left, step_s=step_s))
                # memory as each window ends, the loader at its steady state: sampled here,
                # not by a thread of this process, which would compete with the loader's
                with contextlib.suppress(OSError, KeyError, ValueError):  # /proc does not say
                    peak = max(peak or 0, _private(os.getpid()))
    except (RuntimeError, OSError, MemoryError) as exc:  # one config failing must not end the sweep
        return Measured(config, None, error=one_line(exc))
    rates, waits = zip(*timed)
    return Measured(config, Stat.of(rates), statistics.median_high(waits), peak)


def tune(
    pack: str | os.PathLike,
    sweep: Sweep,
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
    if plot is not None:  # so do a missing matplotlib and a folder the plot cannot go in
        pyplot()
        if not Path(plot).parent.is_dir():
            raise InvalidArgumentError(f"--plot {plot}: folder {Path(plot).parent} does not exist")
    configs = sweep_configs(cuda=torch.cuda.is_available(), workers=workers, prefetch=prefetch)
    t0, measured = time.perf_counter(), []
    for i, config in enumerate(configs):
        left = budget_s - (time.perf_counter() - t0)
        if left <= 0:  # the rest are listed as not measured
            break
        m = measure(pack, config, sweep, left / (len(configs) - i))
        measured.append(m)
        done = m.error or f"{m.rates.median:,.0f} images/s"
        click.echo(f"[{i + 1}/{len(configs)}] {config.label}: {done}", err=True)
    cores, mem = usable_cores() or 1, mem_available()
    verdict = decide(
        measured, sweep, shape=shape, cores=cores, pack_bytes=pack_bytes, mem_available=mem
    )
    if plot is not None:
        plot_sweep([m for m in measured if m.error is None], plot, sweep)
    # a batch is gathered into (H, W, C) uint8 slots, whatever the codec
    skipped = configs[len(measured) :]
    report = format_report(measured, verdict, sweep, record_bytes=math.prod(shape), skipped=skipped)
    # under the report: what the numbers of a version 3 pack mean for the call it recommends,
    # and where the plot is
    notes = {
        "records of many sizes: measured with a transform that keeps the batch as gathered; "
        "the call needs transform=DeviceTransform.train(ds, 224) (or .eval)": varying,
        'yuv420: measured with the conversion to RGB on the CPU; with device="cuda" it runs '
        "on the GPU after the copy (half the bytes of RGB cross the bus)": codec == "yuv420",
        f"plot: {plot}": plot is not None,
    }
    return "\n".join([report, *(text for text, holds in notes.items() if holds)])


def _int_list(minimum: int) -> Callable:
    def parse(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
        try:
            out = tuple(int(v) for v in value.split(",") if v.strip())
        except ValueError:
            out = ()
        if not out or min(out) < minimum:
            raise click.BadParameter(f"{value!r} is not comma-separated integers >= {minimum}")
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
        click.echo(tune(pack, Sweep(batch_size, step_ms, order, cold, repeats), **options))
