"""The starvation meter, driven by a fake clock: known waits and steps give exact numbers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict

import numpy as np
import pytest
import torch

import imgpack
from imgpack.diagnose import meter
from imgpack.diagnose.meter import MeterSummary, images_in, watch
from imgpack.errors import InvalidArgumentError


class Clock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class SlowLoader:
    """Each next() takes waits[i] seconds of the fake clock and gives a batch of ``size`` images."""

    def __init__(self, clock: Clock, waits, size: int = 8, fail_at: int | None = None) -> None:
        self.clock, self.waits, self.size, self.fail_at = clock, list(waits), size, fail_at

    def __len__(self) -> int:
        return len(self.waits)

    def __iter__(self):
        for i, wait in enumerate(self.waits):
            self.clock.advance(wait)
            if i == self.fail_at:
                raise RuntimeError("worker died")
            yield np.zeros((self.size, 2, 2, 3), dtype=np.uint8), np.arange(self.size)


def run(waits, compute=3.0, *, size=8, stop_after=None, clock=None, **kw):
    """Train over a SlowLoader; each step takes ``compute`` seconds. Returns (meter, log lines)."""
    clock, lines = clock or Clock(), []
    w = watch(SlowLoader(clock, waits, size), clock=clock, log=lines.append, progress=False, **kw)
    for i, _batch in enumerate(w):
        clock.advance(compute)
        if stop_after is not None and i + 1 == stop_after:
            break
    return w, lines


def test_exact_fraction_rate_and_warm_up():
    w, lines = run([5.0] + [1.0] * 10, compute=3.0)
    s = w.summary()
    assert s == MeterSummary(
        batches=10,
        images=80,
        seconds=40.0,  # 10 steps of 3 s work + 1 s wait, from the first arrival to the last
        wait_s=10.0,
        data_wait_fraction=0.25,
        images_per_s=2.0,
        wait_p50_s=1.0,
        wait_p90_s=1.0,
        wait_p99_s=1.0,
        step_p50_s=4.0,
        first_batch_s=5.0,  # the warm-up, kept out of everything else
        first_batch_images=8,
        finished=True,
    )
    assert lines[-1] == s.line()
    assert "2 images/s, data wait 25.0% of step time" in s.line()
    assert "wait p50 1e+03 ms" in s.line() and "step p50 4e+03 ms" in s.line()
    assert "10 batches after warm-up, first batch 5 s" in s.line()


def test_percentiles_of_waits_and_steps():
    waits = [0.5] + [float(x) for x in range(101)]
    s = run(waits, compute=0.0)[0].summary()
    assert (s.wait_p50_s, s.wait_p90_s, s.wait_p99_s) == (50.0, 90.0, 99.0)
    assert s.step_p50_s == 50.0  # no work: a step is only its wait
    assert s.data_wait_fraction == 1.0


def test_a_step_pairs_the_previous_work_with_this_wait():
    waits = [1.0, 2.0, 4.0, 8.0]
    clock, computes = Clock(), iter([10.0, 20.0, 30.0, 40.0])
    w = watch(SlowLoader(clock, waits), clock=clock, log=lambda line: None, progress=False)
    for _ in w:
        clock.advance(next(computes))
    s = w.summary()
    # steps: 10+2, 20+4, 30+8; the last batch's work (40 s) ends no step
    assert (s.seconds, s.wait_s, s.step_p50_s) == (74.0, 14.0, 24.0)


def test_live_lines_come_every_interval_over_their_window():
    clock, lines, seen = Clock(), [], []
    w = watch(
        SlowLoader(clock, [1.0] * 10),
        every=10.0,
        clock=clock,
        log=lambda line: lines.append((len(seen), line)),
        progress=False,
    )
    for batch in w:
        seen.append(batch)
        clock.advance(3.0)
    # arrivals at t = 1, 5, 9, 13, ..., 37: reports at the first arrival >= 11, >= 23, >= 35
    assert [n for n, _ in lines] == [3, 6, 9, 10]
    live = [line for _, line in lines[:3]]
    assert live[0].startswith("meter: last 12 s: 2 images/s, data wait 25.0% | wait p50 1e+03 ms")
    assert live[0].endswith("| batch 3")
    assert all("data wait 25.0%" in line for line in live)
    assert lines[-1][1] == w.summary().line()


def test_no_live_line_before_the_interval():
    _, lines = run([1.0] * 5, compute=1.0, every=100.0)
    assert len(lines) == 1 and "4 batches after warm-up" in lines[0]


def test_summary_when_the_loop_is_left_early():
    w, lines = run([2.0] + [1.0] * 20, compute=1.0, stop_after=5)
    s = w.summary()
    assert not s.finished
    assert (s.batches, s.images, s.wait_s, s.data_wait_fraction) == (4, 32, 4.0, 0.5)
    assert lines == [s.line()]  # written as soon as the loop broke


def test_summary_when_the_loader_fails():
    clock, lines = Clock(), []
    w = watch(
        SlowLoader(clock, [1.0] * 6, fail_at=4), clock=clock, log=lines.append, progress=False
    )
    with pytest.raises(RuntimeError, match="worker died"):
        for _ in w:
            clock.advance(1.0)
    assert w.summary().batches == 3 and not w.summary().finished
    assert lines == [w.summary().line()]


def test_sync_ends_each_step_before_the_wait_is_timed():
    clock, calls = Clock(), []

    def sync():
        calls.append(clock.now)
        clock.advance(2.0)  # the GPU finishing its queued work

    w, _ = run([1.0] * 11, compute=3.0, sync=sync, clock=clock)
    s = w.summary()
    assert len(calls) == 11  # before every next() after the first, the last one included
    assert (s.wait_s, s.seconds, s.step_p50_s) == (10.0, 60.0, 6.0)
    assert s.data_wait_fraction == 1 / 6


def test_empty_and_single_batch_loaders():
    w, lines = run([])
    s = w.summary()
    assert (s.batches, s.first_batch_s, s.finished, s.data_wait_fraction) == (0, None, True, None)
    assert lines == ["meter: the loader gave no batches"]
    w, lines = run([4.0])
    s = w.summary()
    assert (s.batches, s.first_batch_s, s.wait_p50_s, s.images_per_s) == (0, 4.0, None, None)
    assert lines == ["meter: only the warm-up batch was seen (first batch 4 s)"]


def test_each_pass_starts_fresh():
    clock = Clock()
    w = watch(SlowLoader(clock, [1.0] * 4), clock=clock, log=lambda line: None, progress=False)
    for _ in w:
        clock.advance(1.0)
    first = w.summary()
    for _ in w:
        clock.advance(3.0)
    second = w.summary()
    assert (first.data_wait_fraction, second.data_wait_fraction) == (0.5, 0.25)
    assert second.batches == 3


def test_samples_are_thinned_but_sums_stay_exact():
    waits = [1.0] + [float(x) for x in range(1000)]
    w, _ = run(waits, compute=0.0, max_samples=16)
    s = w.summary()
    assert (s.batches, s.wait_s, s.images) == (1000, sum(range(1000)), 8000)
    assert 400 <= s.wait_p50_s <= 600 and s.wait_p99_s >= 900


def test_images_in_common_batch_shapes():
    images = np.zeros((5, 4, 4, 3), dtype=np.uint8)
    assert images_in((images, np.arange(5))) == 5
    assert images_in([torch.zeros(6, 3, 2, 2), torch.zeros(6)]) == 6
    assert images_in({"image": torch.zeros(7, 3), "label": torch.zeros(7)}) == 7
    assert images_in(torch.zeros(3, 1)) == 3
    assert images_in([[1, 2], [0, 1]]) == 2
    with pytest.raises(InvalidArgumentError, match="batch of type int .* pass batch_size_of"):
        images_in(7)


def test_real_dataloader_batches_are_counted():
    ds = torch.utils.data.TensorDataset(torch.zeros(20, 3, 2, 2), torch.arange(20))
    lines = []
    w = watch(torch.utils.data.DataLoader(ds, batch_size=4), log=lines.append, progress=False)
    assert len(w) == 5
    assert sum(len(x) for x, _ in w) == 20
    s = w.summary()
    assert (s.batches, s.images, s.first_batch_images, s.finished) == (4, 16, 4, True)
    assert 0.0 <= s.data_wait_fraction <= 1.0
    json.dumps(asdict(s))  # plain data, ready for a JSON report


def test_custom_batch_size_and_unsized_loaders():
    w, _ = run([1.0] * 3, batch_size_of=lambda batch: 100)
    assert w.summary().images == 200
    with pytest.raises(TypeError):
        len(watch(iter([1, 2])))
    with pytest.raises(InvalidArgumentError, match="pass batch_size_of"):
        list(watch([1, 2], log=lambda line: None, progress=False))


@pytest.mark.parametrize("every", [0, -1.0, True, "10", float("nan")])
def test_bad_interval_is_refused(every):
    with pytest.raises(InvalidArgumentError, match="every must be seconds > 0"):
        watch([], every=every)


def test_bad_sample_cap_is_refused():
    with pytest.raises(InvalidArgumentError, match="max_samples 1 is not an int >= 2"):
        watch([], max_samples=1)


def test_progress_bar_carries_the_live_numbers(capsys):
    clock = Clock()
    w = watch(SlowLoader(clock, [1.0] * 10), every=10.0, clock=clock, progress=True)
    for _ in w:
        clock.advance(3.0)
    err = capsys.readouterr().err
    assert "data wait 25%, 2 img/s, wait p90 1e+03 ms" in err  # the postfix
    assert "meter: last" not in err  # live lines would break the bar: postfix only
    assert w.summary().line() in err


def test_default_output_is_stderr_without_a_terminal(capsys):
    clock = Clock()
    for _ in watch(SlowLoader(clock, [1.0] * 4), clock=clock):
        clock.advance(1.0)
    captured = capsys.readouterr()
    assert captured.out == "" and "meter: 4 images/s, data wait 50.0%" in captured.err


def test_meter_is_light_to_import():
    assert imgpack.watch is meter.watch
    code = "import imgpack.diagnose.meter, sys; assert not {'torch', 'tqdm'} & set(sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_the_meter_adds_little_to_a_batch():
    """Two clock reads and a few additions per batch: far below any training step (the
    bound is loose, for a busy machine)."""
    items = [(np.zeros((2, 3, 4, 4), dtype=np.uint8), np.zeros(2, dtype=np.int64))] * 2000

    def best(wrap) -> float:
        times = []
        for _ in range(3):
            t = time.perf_counter()
            for _ in wrap(items):
                pass
            times.append(time.perf_counter() - t)
        return min(times)

    metered = best(lambda x: watch(x, log=lambda line: None, progress=False))
    assert (metered - best(lambda x: x)) / len(items) < 100e-6
