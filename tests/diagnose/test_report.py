"""The meter's numbers and lines, apart from its timing loop."""

from __future__ import annotations

import numpy as np

from imgpack.diagnose.report import MeterSummary, live_line, ms, window_numbers


def test_window_numbers_are_rates_and_percentiles_of_the_samples():
    w = window_numbers(
        batches=4,
        images=32,
        seconds=2.0,
        wait_s=0.5,
        waits=np.array([0.1, 0.1, 0.1, 0.2]),
        steps=np.array([0.5, 0.4, 0.6, 0.5]),
    )
    assert w["data_wait_fraction"] == 0.25 and w["images_per_s"] == 16.0
    assert w["wait_p50_s"] == 0.1 and w["step_p50_s"] == 0.5
    line = live_line(w, 5)
    assert line.startswith("meter: last 2 s: 16 images/s, data wait 25.0% | wait p50 100 ms")
    assert line.endswith("| step p50 500 ms | batch 5")


def test_undefined_numbers_are_none_and_print_as_a_question_mark():
    empty = np.empty(0)
    w = window_numbers(batches=0, images=0, seconds=0.0, wait_s=0.0, waits=empty, steps=empty)
    assert w["data_wait_fraction"] is None and w["images_per_s"] is None
    assert w["wait_p99_s"] is None and w["step_p50_s"] is None and ms(None) == "?"
    summary = MeterSummary(**w, first_batch_s=None, first_batch_images=0, finished=True)
    assert summary.line() == "meter: the loader gave no batches"
