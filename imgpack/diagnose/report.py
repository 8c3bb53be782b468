"""What the starvation meter reports: the numbers over a run of batches, and their lines.

The meter (``imgpack.diagnose.meter``) only times batches and keeps samples; the numbers
it derives from them, the summary it hands back and the lines it logs are here, pure
functions of what it measured, so they can be read and tested apart from the timing loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MeterSummary", "window_numbers", "live_line", "ms"]


def ms(seconds: float | None) -> str:
    """Seconds as milliseconds for a log line, with 3 significant digits ("?" if unknown)."""
    return "?" if seconds is None else f"{seconds * 1e3:.3g} ms"


def window_numbers(
    *,
    batches: int,
    images: int,
    seconds: float,
    wait_s: float,
    waits: np.ndarray,
    steps: np.ndarray,
) -> dict[str, Any]:
    """The meter's numbers over a window: the totals given, and percentiles of its samples.

    A rate or a fraction is None where it is undefined (no batch, or no time).
    """
    p50, p90, p99 = np.percentile(waits, [50, 90, 99]).tolist() if len(waits) else [None] * 3
    timed = bool(batches) and seconds > 0
    return {
        "batches": batches,
        "images": images,
        "seconds": seconds,
        "wait_s": wait_s,
        "data_wait_fraction": wait_s / seconds if timed else None,
        "images_per_s": images / seconds if timed else None,
        "wait_p50_s": p50,
        "wait_p90_s": p90,
        "wait_p99_s": p99,
        "step_p50_s": float(np.median(steps)) if len(steps) else None,
    }


def live_line(w: dict[str, Any], batch: int) -> str:
    """The live log line for window numbers ``w`` (with a rate), ``batch`` batches in."""
    return (
        f"meter: last {w['seconds']:.3g} s: {w['images_per_s']:,.0f} images/s, data wait "
        f"{w['data_wait_fraction']:.1%} | wait p50 {ms(w['wait_p50_s'])} p90 "
        f"{ms(w['wait_p90_s'])} p99 {ms(w['wait_p99_s'])} | step p50 {ms(w['step_p50_s'])} "
        f"| batch {batch}"
    )


@dataclass(frozen=True)
class MeterSummary:
    """What the meter measured; every number excludes the warm-up (first) batch.

    Undefined numbers (fewer than two batches) are None.
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
    first_batch_s: float | None  # the warm-up wait, None if the loader gave nothing
    first_batch_images: int
    finished: bool  # the loader ran out (False: the loop was left early or is still running)

    def line(self) -> str:
        """One line for a log: the numbers that say whether the GPU starves."""
        if self.first_batch_s is None:
            return "meter: the loader gave no batches"
        first = f"first batch {self.first_batch_s:.3g} s"
        if not self.batches:
            return f"meter: only the warm-up batch was seen ({first})"
        return (
            f"meter: {self.images_per_s:,.0f} images/s, data wait {self.data_wait_fraction:.1%} "
            f"of step time | wait p50 {ms(self.wait_p50_s)} p90 {ms(self.wait_p90_s)} "
            f"p99 {ms(self.wait_p99_s)} | step p50 {ms(self.step_p50_s)} | "
            f"{self.batches} batches after warm-up, {first}"
        )
