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

Overhead: two clock reads, a few additions and two ``array.append`` per batch, so
that the meter costs far less than the training step it watches; percentile
samples are thinned to every 2nd, 4th, ... batch past ``max_samples``, so memory
stays bounded for endless loaders. ``python -m imgpack.diagnose.meter``
(``measure_overhead``) measures the cost per batch; docs/benchmarks.md has the
figure, dated.
"""

from __future__ import annotations

import math
import sys
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from imgpack.diagnose.report import MeterSummary, live_line, ms, window_numbers
from imgpack.errors import InvalidArgumentError

# Watched.summary() returns an imgpack.diagnose.report.MeterSummary
__all__ = ["watch", "Watched", "images_in", "measure_overhead"]


def images_in(batch: Any) -> int:
    """Images in a batch: the length of its first tensor ((images, labels), a dict, or a tensor)."""
    first = batch
    if isinstance(batch, (tuple, list)) and batch:
        first = batch[0]
    elif isinstance(batch, dict) and batch:
        first = next(iter(batch.values()))
    try:
        return first.shape[0]  # numpy and torch; faster than len() on a tensor
    except (AttributeError, IndexError, TypeError):
        pass
    try:
        return len(first)
    except TypeError:
        raise InvalidArgumentError(
            f"watch: cannot tell how many images a batch of type {type(batch).__name__} holds; "
            "pass batch_size_of=callable"
        ) from None


class Watched:
    """An iterable over ``loader`` that times every batch; see ``watch``.

    Each ``iter()`` is a fresh pass (fresh numbers, its own warm-up batch);
    ``summary()`` describes the latest pass, also while it runs.
    """

    def __init__(
        self,
        loader: Iterable,
        *,
        every: float,
        log: Callable[[str], None] | None,
        progress: bool | None,
        clock: Callable[[], float],
        batch_size_of: Callable[[Any], int] | None,
        sync: Callable[[], Any] | None,
        max_samples: int,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not every > 0:
            raise InvalidArgumentError(f"watch: every must be seconds > 0, got {every!r}")
        if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 2:
            raise InvalidArgumentError(
                f"watch: max_samples must be an int >= 2, got {max_samples!r}"
            )
        self.loader = loader
        self.every = float(every)
        self._log = log
        self._progress = progress
        self._clock = clock
        self._size_of = batch_size_of or images_in
        self._sync = sync
        self._max_samples = max_samples
        self._reset()

    def __len__(self) -> int:
        return len(self.loader)  # TypeError, as for any unsized iterable, when it has none

    def __iter__(self) -> Iterator:
        return self._run()

    # -- the hot loop ------------------------------------------------------------

    def _reset(self) -> None:
        self._waits, self._steps = array("d"), array("d")
        self._stride = 1  # keep every stride-th measured batch as a percentile sample
        self._batches = self._images = 0
        self._wait_s = 0.0
        self._first_s: float | None = None
        self._first_images = 0
        self._t_first = self._t_last = 0.0
        self._finished = False
        self._mark = (0.0, 0, 0, 0.0, 0)  # window start: time, batches, images, wait, samples
        self._next_report = math.inf

    def _run(self) -> Iterator:
        self._reset()
        clock, sync, size_of = self._clock, self._sync, self._size_of
        waits, steps = self._waits, self._steps
        it = iter(self.loader)
        bar = self._open_bar()
        try:
            t0 = clock()
            try:
                batch = next(it)
            except StopIteration:
                self._finished = True
                return
            t1 = clock()
            self._first_s, self._first_images = t1 - t0, size_of(batch)
            self._t_first = self._t_last = t1
            self._mark = (t1, 0, 0, 0.0, 0)
            self._next_report = t1 + self.every
            if bar is not None:
                bar.update()
            yield batch
            while True:
                if sync is not None:
                    sync()
                t0 = clock()
                try:
                    batch = next(it)
                except StopIteration:
                    self._finished = True
                    return
                t1 = clock()
                wait = t1 - t0
                n = self._batches = self._batches + 1
                self._wait_s += wait
                self._images += size_of(batch)
                if n % self._stride == 0:
                    waits.append(wait)
                    steps.append(t1 - self._t_last)
                    if len(waits) >= self._max_samples:
                        self._thin()
                self._t_last = t1
                if bar is not None:
                    bar.update()
                if t1 >= self._next_report:
                    self._report(t1, bar)
                yield batch
        finally:
            self._close(bar)

    def _thin(self) -> None:
        """Keep every other sample and sample half as often from now on: bounded memory."""
        del self._waits[1::2]
        del self._steps[1::2]
        self._stride *= 2
        t, b, i, w, s = self._mark
        self._mark = (t, b, i, w, s // 2)

    # -- reporting ---------------------------------------------------------------

    def _numbers(self, since: tuple) -> dict[str, Any]:
        t0, b0, i0, w0, s0 = since
        return window_numbers(
            batches=self._batches - b0,
            images=self._images - i0,
            seconds=self._t_last - t0,
            wait_s=self._wait_s - w0,
            # copies: an array.array refuses to grow while numpy still views its buffer
            waits=np.frombuffer(self._waits, dtype=np.float64)[s0:].copy(),
            steps=np.frombuffer(self._steps, dtype=np.float64)[s0:].copy(),
        )

    def summary(self) -> MeterSummary:
        """The numbers so far for this pass (the whole pass once the loop is over)."""
        return MeterSummary(
            **self._numbers((self._t_first, 0, 0, 0.0, 0)),
            first_batch_s=self._first_s,
            first_batch_images=self._first_images,
            finished=self._finished,
        )

    def _report(self, now: float, bar) -> None:
        """The live line: numbers over the window since the previous report."""
        w = self._numbers(self._mark)
        self._mark = (now, self._batches, self._images, self._wait_s, len(self._waits))
        self._next_report = now + self.every
        if not w["batches"] or w["data_wait_fraction"] is None:
            return
        fraction, rate = w["data_wait_fraction"], w["images_per_s"]
        if bar is not None:
            bar.set_postfix_str(f"data wait {fraction:.0%}, {rate:,.0f} img/s, "
                                f"wait p90 {ms(w['wait_p90_s'])}")  # fmt: skip
        if bar is None or self._log is not None:
            self._emit(live_line(w, self._batches), bar)

    def _emit(self, line: str, bar) -> None:
        if self._log is not None:
            self._log(line)
        elif bar is not None:
            bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def _open_bar(self):
        show = self._progress
        if show is None:
            show = bool(getattr(sys.stderr, "isatty", lambda: False)())
        if not show:
            return None
        from tqdm.auto import tqdm  # only when a bar is wanted

        try:
            total = len(self.loader)
        except TypeError:
            total = None
        return tqdm(total=total, unit="batch", dynamic_ncols=True, file=sys.stderr)

    def _close(self, bar) -> None:
        if bar is not None:
            bar.close()
        self._emit(self.summary().line(), bar)


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
    return Watched(
        loader,
        every=every,
        log=log,
        progress=progress,
        clock=clock,
        batch_size_of=batch_size_of,
        sync=sync,
        max_samples=max_samples,
    )


def measure_overhead(n: int = 100_000, repeats: int = 5) -> float:
    """Seconds the meter adds per batch: a loop over ``n`` ready batches, with and without it.

    Best of ``repeats`` each way, so that other processes on a busy machine
    inflate the number as little as possible.
    """
    batch = (np.zeros((2, 3, 4, 4), dtype=np.uint8), np.zeros(2, dtype=np.int64))
    items = [batch] * n

    def bare() -> float:
        t = time.perf_counter()
        for _ in items:
            pass
        return time.perf_counter() - t

    def metered() -> float:
        t = time.perf_counter()
        for _ in watch(items, log=lambda line: None, progress=False):
            pass
        return time.perf_counter() - t

    return (
        max(0.0, min(metered() for _ in range(repeats)) - min(bare() for _ in range(repeats))) / n
    )


if __name__ == "__main__":
    print(f"meter overhead: {measure_overhead() * 1e6:.2f} µs per batch")
