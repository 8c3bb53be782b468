"""imgpack.reader.run: the pool that shares out a batch's work, and its end."""

from __future__ import annotations

import threading

import pytest

from imgpack.errors import FormatError, InvalidArgumentError, LoaderError
from imgpack.reader.options import InProcessOptions
from imgpack.reader.run import POOL, POOL_THREAD_NAME, Pool, check_threads


def test_the_pool_runs_every_index_once_on_its_threads():
    """Two parts wait for each other: that only ends if two threads run at once."""
    seen, names = [], set()
    both = threading.Barrier(2, timeout=10)

    def work(i):
        if i < 2:
            both.wait()  # BrokenBarrierError if every part ran on one thread
        seen.append(i)
        names.add(threading.current_thread().name)

    POOL.run(500, work, 4)
    assert sorted(seen) == list(range(500))
    assert any(n.startswith(POOL_THREAD_NAME) for n in names)
    assert all(
        n == threading.current_thread().name or n.startswith(POOL_THREAD_NAME) for n in names
    )
    order, where = [], set()

    def plain(i):
        order.append(i)
        where.add(threading.current_thread().name)

    POOL.run(3, plain, 1)
    assert order == [0, 1, 2] and where == {threading.current_thread().name}  # a plain loop


def test_the_pool_raises_the_first_error_and_stops():
    done = []

    def work(i):
        if i == 10:
            raise FormatError(f"x.bin record {i}: damaged JPEG record (test)")
        done.append(i)

    with pytest.raises(FormatError, match="record 10"):
        POOL.run(10_000, work, 3)
    assert len(done) < 10_000 - 1


def test_a_set_stop_ends_the_run_before_the_parts_left():
    stop, done = threading.Event(), []

    def work(i):
        done.append(i)
        if i == 5:
            stop.set()

    with pytest.raises(LoaderError, match="closed"):
        POOL.run(1000, work, 2, stop)
    assert 6 <= len(done) < 1000


def test_a_closed_pool_starts_again_and_joins_its_threads():
    before = set(threading.enumerate())
    pool = Pool()
    pool.run(50, lambda i: None, 3)
    started = [t for t in threading.enumerate() if t not in before]
    assert started and all(t.name.startswith(POOL_THREAD_NAME) for t in started)
    pool.close()
    assert not any(t.is_alive() for t in started)
    out = []
    pool.run(20, out.append, 2)
    assert sorted(out) == list(range(20))
    pool.close()


def test_thread_counts():
    assert check_threads(None) >= 1 and check_threads(3) == 3
    for bad in (0, -1, 2.0, True, "2"):
        with pytest.raises(InvalidArgumentError, match="gather_threads should be"):
            InProcessOptions(gather_threads=bad)
