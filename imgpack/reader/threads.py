"""imgpack's threads: the pool that shares out one batch's work, and their end at exit.

**The pool.** ``POOL.run(n, work, threads)`` calls ``work(i)`` for every i in range(n) on
``threads`` threads, the caller's own among them (``threads=1`` is a plain loop: no thread
is started). Each thread takes the next i from one shared counter, so parts of different
cost balance by themselves and a batch costs one task per thread, not one per part. The
work is numpy copies and JPEG decodes, which release the GIL, so the threads scale. One
pool per process, made on first use and made again in a forked child (whose copy of the
parent's pool has no threads behind it).

**The end.** A daemon thread still inside torch or numpy while Python finalises aborts
the whole process (``terminate called without an active exception``, status 134): a
training script that returns while it still holds a loader iterator would look failed to
its scheduler. So imgpack's threads are ordinary (non-daemon) threads, and whoever starts
one registers its ``close()`` here (``close_at_exit``). One hook, registered with
``threading._register_atexit`` as ``concurrent.futures`` does, closes them when the main
thread is done, before the interpreter joins the remaining threads and long before it tears
anything down; a loader that feeds another live non-daemon thread is left to it (the
interpreter waits for that thread, and the loader ends with its pass).
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Protocol

from torch.utils.data import get_worker_info

from imgpack.errors import InvalidArgumentError
from imgpack.machine import usable_cores

__all__ = [
    "Closeable",
    "Stopped",
    "POOL",
    "Pool",
    "POOL_THREAD_NAME",
    "default_threads",
    "check_threads",
    "close_at_exit",
    "forget_at_exit",
    "close_all",
]

POOL_THREAD_NAME = "imgpack-pool"


class Closeable(Protocol):
    def close(self) -> None:
        """Stop the owner's threads and join them."""


class Stopped(Exception):
    """A pool run gave up because its ``stop`` event was set (the loader was closed)."""


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


class Pool:
    """A process's helper threads (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._size, self._pid = 0, -1
        self.closes = 0  # close() calls: a helper stops when this changes under it

    def _helpers(self, count: int) -> ThreadPoolExecutor:
        """An executor of at least ``count`` threads in this process."""
        with self._lock:
            if self._pid != os.getpid():  # new here, or inherited through fork: no threads
                self._executor, self._size, self._pid = None, 0, os.getpid()
            if self._executor is None or self._size < count:
                old = self._executor
                self._executor = ThreadPoolExecutor(count, thread_name_prefix=POOL_THREAD_NAME)
                self._size = count
                if old is not None:
                    old.shutdown(wait=False)  # its threads end once their tasks do
                close_at_exit(self)
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
        shares = min(threads, n)
        counter = itertools.count()  # next() on it is atomic under the GIL
        failed, closes = threading.Event(), self.closes

        def share(helper: bool) -> None:
            while not failed.is_set() and not (helper and self.closes != closes):
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
        if shares > 1:
            try:
                pool = self._helpers(shares - 1)
                futures = [pool.submit(share, True) for _ in range(shares - 1)]
            except RuntimeError:  # interpreter exit: no new threads; do it all here
                pass
        error: BaseException | None = None
        try:
            share(False)
        except BaseException as e:
            error = e
        for f in futures:
            error = error or f.exception()
        if error is not None:  # (a helper stopped by close() left nothing: the caller's
            raise error  # share runs until the counter passes n)

    def close(self) -> None:
        """Stop the threads (parts under way finish) and join them; a later run starts new
        ones."""
        with self._lock:
            self.closes += 1
            executor, self._executor = self._executor, None
        forget_at_exit(self)
        if executor is not None and self._pid == os.getpid():
            executor.shutdown(wait=True)


# The owners with a thread that may be running, each with the thread it serves (None: the
# process). Weak: a thread's target keeps its owner alive while it runs, and an owner that
# is gone has no thread left to stop.
_owners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_owners_lock = threading.Lock()


def close_at_exit(owner: Closeable, serves: threading.Thread | None = None) -> None:
    """Close ``owner`` when the main thread is done, unless it was closed before, or unless
    ``serves`` (the thread reading its batches) is another non-daemon thread still running:
    the interpreter waits for that thread, so its loader must keep working until it ends."""
    with _owners_lock:
        _owners[owner] = serves


def forget_at_exit(owner: Closeable) -> None:
    with _owners_lock:
        _owners.pop(owner, None)


def _still_served(thread: threading.Thread | None) -> bool:
    return (
        thread is not None
        and thread is not threading.current_thread()
        and not thread.daemon
        and thread.is_alive()
    )


def close_all() -> None:
    """Close every watched owner not serving a live thread (the exit hook; tests call it)."""
    with _owners_lock:
        owners = [o for o, serves in _owners.items() if not _still_served(serves)]
    for owner in owners:
        owner.close()


POOL = Pool()

# Runs when the main thread is done, before the interpreter joins non-daemon threads
# (a plain ``atexit`` hook would run only after those joins, which would then wait forever).
threading._register_atexit(close_all)
