"""Worker processes of the packer: listing on every core, and every pool stopped in bounded
time, the listing's and the decoders' alike (``WorkerPool.stop``)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

from imgpack.packer.parallel import WorkerPool, map_in_processes


def _square_or_fail(k: int) -> int:
    if k == 3:
        raise ValueError(f"item {k} is bad")
    return k * k


def _pid() -> int:
    return os.getpid()


def test_results_come_in_order_and_a_failure_leaves_no_worker():
    names = [f"f{k}" for k in range(3)]
    assert list(map_in_processes(_square_or_fail, [(k,) for k in range(3)], workers=2,
                                 names=names)) == [0, 1, 4]  # fmt: skip
    with pytest.raises(ValueError, match="item 3 is bad"):
        list(map_in_processes(_square_or_fail, [(k,) for k in range(6)], workers=2,
                              names=[f"f{k}" for k in range(6)]))  # fmt: skip
    assert mp.active_children() == []


def test_a_busy_pool_is_stopped_in_bounded_time():
    pool = WorkerPool(1, None, None)
    assert pool.submit(_pid).result(timeout=60) != os.getpid()
    busy = pool.submit(time.sleep, 600)
    time.sleep(0.2)  # running now
    started = time.monotonic()
    pool.stop(kill=True)
    assert time.monotonic() - started < 5
    assert mp.active_children() == [] and busy.done()
