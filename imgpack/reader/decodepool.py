"""Threads that decode a batch's records at once: the decoder releases the GIL, so they scale.

``POOL.run(n, work, threads)`` calls ``work(i)`` for every i in range(n) on ``threads``
threads, the caller's own among them (``threads=1`` is a plain loop, no thread started).
Each thread takes the next record from one shared counter, so records of different sizes
balance by themselves and a batch costs one task per thread, not one per record.

One pool per process, made on first use, made again in a forked child (whose copy of
the parent's pool has no threads behind it), and closed when the main thread is done
(``imgpack.reader.threads``): no thread outlives the interpreter. A run that can start no
thread (the interpreter is exiting) does its whole batch in the caller's thread.

Threads: the CPUs this process may use, since decoding is pure CPU work; in a DataLoader
worker process, that divided by the number of workers (the workers are the parallelism).
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from torch.utils.data import get_worker_info

from imgpack.errors import InvalidArgumentError
from imgpack.machine import usable_cores
from imgpack.reader import threads as lifetime

__all__ = ["DecodePool", "POOL", "THREAD_NAME", "default_threads", "check_threads"]

THREAD_NAME = "imgpack-decode"


def default_threads() -> int:
    """The CPUs this process may use; in a DataLoader worker, its share of them."""
    cores = usable_cores()
    info = get_worker_info()
    return max(1, cores // info.num_workers) if info is not None else cores


def check_threads(threads: int | None) -> int:
    """``threads`` as a count (None: ``default_threads()``), or InvalidArgumentError."""
    if threads is None:
        return default_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InvalidArgumentError(f"threads should be an int >= 1 or None, found {threads!r}")
    return threads


class DecodePool:
    """A process's decoding threads (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._size, self._pid = 0, -1
        self.closes = 0  # close() calls: a helper stops when this changes under it

    def _helpers(self, count: int) -> ThreadPoolExecutor | None:
        """An executor of at least ``count`` threads in this process."""
        with self._lock:
            if self._pid != os.getpid():  # new here, or inherited through fork: no threads
                self._executor, self._size, self._pid = None, 0, os.getpid()
            if self._executor is None or self._size < count:
                old = self._executor
                self._executor = ThreadPoolExecutor(count, thread_name_prefix=THREAD_NAME)
                self._size = count
                if old is not None:
                    old.shutdown(wait=False)  # its threads end once their tasks do
                lifetime.watch(self)
            return self._executor

    def run(self, n: int, work: Callable[[int], None], threads: int) -> None:
        """``work(i)`` for i in range(n) over ``threads`` threads; the first exception raised
        (after every thread has stopped) is raised here."""
        shares = min(threads, n)
        counter = itertools.count()  # next() on it is atomic under the GIL
        failed, closes = threading.Event(), self.closes

        def share(helper: bool) -> None:
            while not failed.is_set() and not (helper and self.closes != closes):
                i = next(counter)
                if i >= n:
                    return
                try:
                    work(i)
                except BaseException:
                    failed.set()
                    raise

        futures: list[Future] = []
        if shares > 1:
            try:
                pool = self._helpers(shares - 1)
                for _ in range(shares - 1):
                    futures.append(pool.submit(share, True))
            except RuntimeError:  # interpreter exit: no new threads; do it all here
                pass
        error: BaseException | None = None
        try:
            share(False)
        except BaseException as e:
            error = e
        for f in futures:
            e = f.exception()
            error = error or e
        if error is not None:  # (a helper stopped by close() left nothing: the caller's
            raise error  # share runs until the counter passes n)

    def close(self) -> None:
        """Stop the threads (tasks under way finish their record) and join them; a later
        run starts new ones."""
        with self._lock:
            self.closes += 1
            executor, self._executor = self._executor, None
        lifetime.unwatch(self)
        if executor is not None and self._pid == os.getpid():
            executor.shutdown(wait=True)


POOL = DecodePool()
