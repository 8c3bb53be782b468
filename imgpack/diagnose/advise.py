"""What ``pack-images tune`` concludes from its measurements: pure functions, no clock.

``decide`` picks the fastest config, the cheapest one within noise of it, and
says when nothing keeps up with the training step and what would; ``format_report``
prints it. Keeping this free of timing lets tests feed it made-up numbers.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "Stat",
    "Sweep",
    "Config",
    "Measured",
    "Verdict",
    "sweep_configs",
    "decide",
    "format_report",
    "pack_notes",
]

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
        if self.mode == "workers":
            top, kind, fields = {"num_workers": self.num_workers}, "WorkerOptions", {}
            if self.prefetch_factor is not None:
                fields = {"prefetch_factor": self.prefetch_factor}
            return top, kind if fields else "", fields
        fields = {"prefetch": self.prefetch_factor, "gather_threads": self.gather_threads}
        return {}, "InProcessOptions", {k: v for k, v in fields.items() if v is not None}

    def kwargs(self) -> dict[str, Any]:
        # The reader's option classes; importing the reader imports torch. Only this method
        # does, so deciding on and printing the advice (the rest of this module) need no torch.
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
    row = "{:<28} {:>10} {:>17} {:>6} {:>10} {:>10}"  # the columns, then the marks
    lines = [row.format("config", "images/s", "min-max", "wait", "private MB", "batches MB")]
    for m in measured:
        if m.error is not None:  # (v is None only where every config failed)
            lines.append(f"{m.config.label:<28} failed: {m.error}")
            continue
        mark = "*" if m is v.fastest else "=" if m in v.ties else ""
        mark += " <- recommended" if m is v.recommended else ""
        r = m.rates
        wait = "n/a" if m.wait_fraction is None else f"{100 * m.wait_fraction:.0f}%"
        flight = m.config.buffers * bs * record_bytes
        memory = (_mb(m.peak_private), _mb(flight))
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


def pack_notes(codec: str, varying: bool) -> list[str]:
    """What the numbers of a version 3 pack mean for the call the report recommends."""
    notes = {
        "records of many sizes: measured with a transform that keeps the batch as gathered; "
        "the call needs transform=DeviceTransform.train(ds, 224) (or .eval)": varying,
        'yuv420: measured with the conversion to RGB on the CPU; with device="cuda" it runs '
        "on the GPU after the copy (half the bytes of RGB cross the bus)": codec == "yuv420",
    }
    return [text for text, holds in notes.items() if holds]
