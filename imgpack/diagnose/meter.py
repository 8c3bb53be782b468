"""The starvation meter: does the training loop wait for data?

Wrap any loader and train as usual::

    for images, labels in watch(loader):
        step(images, labels)

For each batch the meter times the **wait** (time spent inside ``next(loader)``)
and the **step** (time from one batch's arrival to the next's, i.e. the user's
work on the previous batch plus this wait). It reports the data-wait fraction
(total wait / total step time: 0% means the loader always had a batch ready),
images/s, wait latency p50/p90/p99 and the step p50: live every ``every``
seconds (a log line, or a tqdm postfix), and as a summary when the loop ends or
is left early. The first batch is the warm-up (workers starting, cold caches):
it is reported apart as ``first_batch_s`` and kept out of every other number.

CUDA: kernels run asynchronously, so the host reaches ``next()`` while the GPU
is still busy and the "wait" would overlap GPU work. Pass
``sync=torch.cuda.synchronize`` to end each step on the GPU's clock; this costs
the host/GPU overlap of one step, so use it to diagnose, not in every run.

Overhead: two clock reads, a few additions and at most four ``array.append`` per
batch, so that the meter costs far less than the training step it watches; percentile
samples (of the pass, and of the live line's window) are thinned to every 2nd, 4th, ...
batch past ``max_samples``, so memory stays bounded for endless loaders.
"""

from __future__ import annotations

import operator
import sys
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from imgpack.errors import InvalidArgumentError
from imgpack.validate import is_int, is_number

__all__ = ["watch", "Watched", "MeterSummary", "images_in"]


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1e3:.3g} ms"


@dataclass(frozen=True)
class MeterSummary:
    """What the meter measured; every number excludes the warm-up (first) batch.

    Undefined numbers (fewer than two batches, or no time) are None.
    """

    batches: int  # measured batches
    images: int  # images in the measured batches
    seconds: float  # from the first batch's arrival to the last's
    wait_s: float  # time spent inside next(loader) for the measured batches
    data_wait_fraction: float | None  # wait_s / seconds
    images_per_s: float | None
    wait_p50_s: float | None
    wait_p90_s: float | None
    wait_p99_s: float | None
    step_p50_s: float | None
    first_batch_s: float | None = None  # the warm-up wait, None if the loader gave nothing
    first_batch_images: int = 0
    finished: bool = False  # the loader ran out (False: left early, or still running)

    def _line(self, lead: str, of: str, tail: str) -> str:
        return (
            f"meter: {lead}{self.images_per_s:,.0f} images/s, data wait "
            f"{self.data_wait_fraction:.1%}{of} | wait p50 {_ms(self.wait_p50_s)} p90 "
            f"{_ms(self.wait_p90_s)} p99 {_ms(self.wait_p99_s)} | step p50 {_ms(self.step_p50_s)} "
            f"| {tail}"
        )

    def line(self) -> str:
        """One line for a log: the numbers that say whether the GPU starves."""
        if self.first_batch_s is None:
            return "meter: the loader gave no batches"
        first = f"first batch {self.first_batch_s:.3g} s"
        if not self.batches:
            return f"meter: only the warm-up batch was seen ({first})"
        return self._line("", " of step time", f"{self.batches} batches after warm-up, {first}")


def images_in(batch: Any) -> int:
    """Images in a batch: the length of its first tensor ((images, labels), a dict, or a tensor)."""
    parts = list(batch.values()) if isinstance(batch, dict) else batch
    first = parts[0] if isinstance(parts, (tuple, list)) and parts else batch
    try:
        return len(first)  # a tensor's, an array's or a list's first dimension
    except TypeError:
        raise InvalidArgumentError(
            f"watch: cannot tell how many images a batch of type {type(batch).__name__} holds; "
            "pass batch_size_of=callable"
        ) from None


class _Tally:
    """The batches after ``start``: their sums, and samples of their waits and steps for the
    percentiles, thinned to every 2nd, 4th, ... batch past ``max_samples`` (bounded memory)."""

    def __init__(self, start: float, max_samples: int) -> None:
        self.start = self.last = start
        self.batches = self.images = 0
        self.wait_s = 0.0
        self.waits, self.steps = array("d"), array("d")
        self.stride, self.max_samples = 1, max_samples

    def add(self, wait: float, now: float, images: int) -> None:
        self.batches += 1
        self.wait_s += wait
        self.images += images
        if self.batches % self.stride == 0:
            self.waits.append(wait)
            self.steps.append(now - self.last)
            if len(self.waits) >= self.max_samples:  # keep every other one
                del self.waits[1::2]
                del self.steps[1::2]
                self.stride *= 2
        self.last = now

    def summary(self, **first: Any) -> MeterSummary:
        took, waits = self.last - self.start, self.waits  # (``last`` moves only with a batch)
        p50, p90, p99 = np.percentile(waits, [50, 90, 99]).tolist() if waits else [None] * 3
        fraction, rate = (self.wait_s / took, self.images / took) if took > 0 else (None, None)
        step = float(np.median(self.steps)) if self.steps else None
        numbers = (fraction, rate, p50, p90, p99, step)
        return MeterSummary(self.batches, self.images, took, self.wait_s, *numbers, **first)


class Watched:
    """An iterable over ``loader`` that times every batch; see ``watch``.

    Each ``iter()`` is a fresh pass (fresh numbers, its own warm-up batch);
    ``summary()`` describes the latest pass, also while it runs.
    """

    def __init__(self, loader, every, log, progress, clock, batch_size_of, sync, max_samples):
        if not is_number(every) or not every > 0:
            raise InvalidArgumentError(f"watch: every must be seconds > 0, got {every!r}")
        if not is_int(max_samples) or max_samples < 2:
            raise InvalidArgumentError(f"watch: max_samples {max_samples!r} is not an int >= 2")
        self.loader, self.every = loader, float(every)
        self._log, self._progress, self._clock, self._sync = log, progress, clock, sync
        self._say = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._size_of = batch_size_of or images_in
        self._max_samples = max_samples
        self._reset()

    def __len__(self) -> int:
        return len(self.loader)  # TypeError, as for any unsized iterable, when it has none

    def _reset(self, start: float = 0.0, first_s: float | None = None, images: int = 0) -> None:
        """A pass from ``start``, after a warm-up batch of ``images`` that took ``first_s``
        (None: not yet come): its tally, and the window of the next live line."""
        self._first_s, self._first_images, self._finished = first_s, images, False
        self._pass = _Tally(start, self._max_samples)
        self._window = _Tally(start, self._max_samples)  # a live line when ``every`` is over

    def __iter__(self) -> Iterator:
        self._reset()
        clock, sync, size_of = self._clock, self._sync, self._size_of
        it = iter(self.loader)
        bar = self._open_bar()
        try:
            while True:
                if sync is not None and self._first_s is not None:
                    sync()
                t0 = clock()
                try:
                    batch = next(it)
                except StopIteration:
                    self._finished = True
                    return
                t1, images = clock(), size_of(batch)
                if self._first_s is None:  # the warm-up: timed apart
                    self._reset(t1, t1 - t0, images)
                else:
                    self._pass.add(t1 - t0, t1, images)
                    self._window.add(t1 - t0, t1, images)
                if bar is not None:
                    bar.update()
                if t1 >= self._window.start + self.every:
                    self._report(t1, bar)
                yield batch
        finally:
            if bar is not None:
                bar.close()
            self._say(self.summary().line())  # the bar, if any, is gone: no line under it

    def summary(self) -> MeterSummary:
        """The numbers so far for this pass (the whole pass once the loop is over)."""
        first = {"first_batch_s": self._first_s, "first_batch_images": self._first_images}
        return self._pass.summary(finished=self._finished, **first)

    def _report(self, now: float, bar) -> None:
        """The live line: numbers over the window since the previous report."""
        w = self._window.summary()
        self._window = _Tally(now, self._max_samples)
        if w.data_wait_fraction is None:  # no time (no batch: ``last`` moves with one)
            return
        if bar is not None:
            bar.set_postfix_str(
                f"data wait {w.data_wait_fraction:.0%}, "
                f"{w.images_per_s:,.0f} img/s, wait p90 {_ms(w.wait_p90_s)}"
            )
        if bar is None or self._log is not None:
            self._say(w._line(f"last {w.seconds:.3g} s: ", "", f"batch {self._pass.batches}"))

    def _open_bar(self):
        tty = getattr(sys.stderr, "isatty", lambda: False)  # (no stderr: no terminal)
        if not (tty() if self._progress is None else self._progress):
            return None
        from tqdm.auto import tqdm  # only when a bar is wanted

        # the loader's length, where it has one (0, no length: a bar without a total)
        total = operator.length_hint(self.loader) or None
        return tqdm(total=total, unit="batch", dynamic_ncols=True, file=sys.stderr)


def watch(
    loader: Iterable,
    *,
    every: float = 10.0,
    log: Callable[[str], None] | None = None,
    progress: bool | None = None,
    clock: Callable[[], float] = time.perf_counter,
    batch_size_of: Callable[[Any], int] | None = None,
    sync: Callable[[], Any] | None = None,
    max_samples: int = 1 << 20,
) -> Watched:
    """Wrap ``loader`` so that iterating it measures how long training waits for data.

    every: seconds between live reports. log: receives each live line and the
    summary (default: print to stderr; with a progress bar, live numbers go to
    its postfix instead). progress: a tqdm bar with the live numbers as postfix
    (None: only when stderr is a terminal). clock: seconds, monotonic (inject a
    fake one in tests). batch_size_of: images in a batch (default
    ``images_in``). sync: called before each ``next()`` after the first, e.g.
    ``torch.cuda.synchronize``. max_samples: percentile samples kept in memory.
    """
    return Watched(loader, every, log, progress, clock, batch_size_of, sync, max_samples)
