"""imgpack's threads: the pool that shares out one batch's work, and their end at exit.

**The pool.** ``POOL.run(n, work, threads)`` calls ``work(i)`` for every i in range(n) on
``threads`` threads, the caller's own among them (``threads=1`` is a plain loop: no thread
is started). Each thread takes the next i from one shared counter, so parts of different
cost balance by themselves and a batch costs one task per thread, not one per part. The
work is numpy copies and JPEG decodes, which release the GIL, so the threads scale. One
pool per process, made on first use and made again in a forked child (whose copy of the
parent's pool has no threads behind it).

**The end.** A thread still inside torch or numpy while Python finalises aborts the whole
process (``terminate called without an active exception``): a training script that
returns while it still holds a loader iterator would look failed to its scheduler. So
whoever starts a thread makes it a daemon and registers its ``close()`` here
(``close_at_exit``); one ``atexit`` handler closes them all. Python runs it after every
non-daemon thread has ended (so a loader that feeds a training thread which outlives the
main thread keeps working until that thread is done) and before it tears anything down,
while the daemon threads still run: each is stopped and joined there.
"""

from __future__ import annotations

import atexit
import itertools
import os
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from torch.utils.data import get_worker_info

from imgpack.machine import usable_cores
from imgpack.reader.order import int_at_least

__all__ = [
    "Stopped",
    "POOL",
    "Pool",
    "POOL_THREAD_NAME",
    "check_threads",
    "close_at_exit",
    "forget_at_exit",
]

POOL_THREAD_NAME = "imgpack-pool"


class Stopped(Exception):
    """A pool run gave up because its ``stop`` event was set (the loader was closed)."""


def check_threads(threads: int | None) -> int:
    """``threads`` as a count, or InvalidArgumentError. None: the CPUs this process may use;
    in a DataLoader worker, its share of them."""
    if threads is None:
        info = get_worker_info()
        return max(1, usable_cores() // (info.num_workers if info is not None else 1))
    return int_at_least("threads", threads, 1)


class Pool:
    """A process's helper threads (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._size, self._pid = 0, -1
        self._closes = 0  # close() calls: a helper stops when this changes under it

    def _helpers(self, count: int) -> ThreadPoolExecutor:
        """An executor of at least ``count`` threads in this process."""
        with self._lock:
            if self._pid != os.getpid():  # new here, or inherited through fork: no threads
                self._executor, self._size, self._pid = None, 0, os.getpid()
            if self._executor is None or self._size < count:
                if self._executor is not None:
                    self._executor.shutdown(wait=False)  # its threads end once their tasks do
                self._executor = ThreadPoolExecutor(count, thread_name_prefix=POOL_THREAD_NAME)
                self._size = count
            return self._executor

    def run(
        self,
        n: int,
        work: Callable[[int], None],
        threads: int,
        stop: threading.Event | None = None,
    ) -> None:
        """``work(i)`` for i in range(n) over ``threads`` threads. The first exception raised
        (after every thread has stopped) is raised here; ``Stopped`` when ``stop`` was set
        before every part was done (each thread checks it before each part)."""
        counter = itertools.count()  # next() on it is atomic
        failed, closes = threading.Event(), self._closes

        def share(helper: bool) -> None:
            while not failed.is_set() and not (helper and self._closes != closes):
                if stop is not None and stop.is_set():
                    failed.set()
                    raise Stopped()
                i = next(counter)
                if i >= n:
                    return
                try:
                    work(i)
                except BaseException:
                    failed.set()
                    raise

        futures: list[Future] = []
        if min(threads, n) > 1:
            try:
                pool = self._helpers(min(threads, n) - 1)
                futures = [pool.submit(share, True) for _ in range(min(threads, n) - 1)]
            except RuntimeError:  # interpreter exit: no new threads; do it all here
                pass
        error: BaseException | None = None
        try:
            share(False)  # (a helper stopped by close() leaves its parts to this one)
        except BaseException as e:
            error = e
        for f in futures:
            error = error or f.exception()
        if error is not None:
            raise error

    def close(self) -> None:
        """Stop the threads (parts under way finish) and join them; a later run starts new
        ones."""
        with self._lock:
            self._closes += 1
            executor, self._executor = self._executor, None
        if executor is not None and self._pid == os.getpid():
            executor.shutdown(wait=True)


# Whatever has a thread that may be running. Weak: a thread's target keeps its owner alive
# while it runs, and an owner that is gone has no thread left to stop.
_owners: weakref.WeakSet = weakref.WeakSet()


def close_at_exit(owner: Any) -> None:
    """Call ``owner.close()`` at exit (see the module docstring), unless forgotten first."""
    _owners.add(owner)


def forget_at_exit(owner: Any) -> None:
    _owners.discard(owner)


@atexit.register
def _close_all() -> None:
    for owner in list(_owners):
        owner.close()
    POOL.close()


POOL = Pool()
