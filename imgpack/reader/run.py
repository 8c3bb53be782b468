"""Where a read runs: in the loop's thread, a thread ahead of it, or a torch DataLoader's
processes; the pool that shares one batch's work; and the end of every thread at exit.

``InProcess`` runs the read stage over the plan in one of two ways:

inline     (``prefetch=0``) the batch is read in the loop's thread when the loop asks for
           it, as a hand-written loop reads it. A copy is memory-bound: a second thread
           beside the consumer's own copy on the same memory bus makes neither faster.
           The next batch's reads are announced to the kernel first (``hint``), so a cold
           pack's pages come in while the step runs.
background (``prefetch=N``) a daemon thread reads up to N batches ahead into a queue:
           where the consumer is a GPU or the read is a decode, that overlap is where the
           time goes.

The items of a plan and of a pass are ``read.Batch`` requests and batches (typed ``Any``
here: ``read`` imports this module, for the pool its stages run on).

``Workers`` runs it in a torch DataLoader: the read stage in ``num_workers`` processes (the
plan is its sampler, ``batch_size=None``: a worker's fetch is one whole ``Batch``, which
comes back with its tensors in shared memory); for a dataset served sample by sample, that
read is ``read.Samples``: torch's own fetch and collate. The DataLoader is made once and
kept (its persistent workers with it); ``close`` drops it, which is how torch stops
persistent workers. A worker's imgpack error comes back as the one line it was raised with.

One pass runs at a time: starting a new one, or closing, ends the previous one, whose
iterator then raises ``LoaderError`` (without persistent workers, DataLoader passes run side
by side, as a DataLoader's do). While the loop waits for a batch, the page-cache warm
pauses (``DEMAND``).

**The pool.** ``POOL.run(n, work, threads)`` calls ``work(i)`` for every i in range(n) on
``threads`` threads, the caller's own among them (``threads=1``: the caller's alone). Each
thread takes the next i from one shared counter, so parts of different cost balance by
themselves. The work is numpy copies, resamples and JPEG decodes, which release the GIL.

**The end.** A thread still inside torch or numpy while Python finalises aborts the process
(``terminate called without an active exception``). So every thread here is a daemon whose
owner registers the method that stops it (``close_at_exit``); one ``atexit`` handler stops and joins
them all, after every non-daemon thread has ended and before anything is torn down.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import os
import queue
import threading
import traceback
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from torch.utils.data import DataLoader, get_worker_info

from imgpack.errors import ImgpackError, LoaderError
from imgpack.machine import usable_cores

__all__ = ["POOL", "DEMAND", "InProcess", "Workers", "check_threads", "close_at_exit"]

THREAD_NAME = "imgpack-loader"  # the in-process loader's thread
POOL_THREAD_NAME = "imgpack-pool"
CLOSED = "the loader was closed, or a new pass over it began (one pass at a time)"
_LIVENESS_S = 2.0  # how often a paused warm wakes to check its stop flag
_JOIN_S = 10.0  # how long closing waits for a read in progress to finish
_MOST_HELPERS = 1024  # the pool's cap, far above any thread count a loader asks for


# -- the pool and the end of threads --------------------------------------------------------


def check_threads(threads: int | None) -> int:
    """``threads`` (a count checked where it was given), or where None the CPUs this process
    may use; in a DataLoader worker, its share of them."""
    if threads is not None:
        return threads
    info = get_worker_info()
    return max(1, usable_cores() // (info.num_workers if info is not None else 1))


class Pool:
    """A process's helper threads, and a fresh set in a forked child (whose copy of the
    parent's pool has no threads behind it, and whose copy of its locks may have been held
    by a thread the child does not have). The executor starts a thread only when no idle
    one is left, so it holds as many as the most parts ever run at once, and its cap is
    never reached."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(_MOST_HELPERS, POOL_THREAD_NAME)
        self._closes = 0  # close() calls: a helper stops when this changes under it

    def run(self, n: int, work: Callable[[int], None], threads: int, stop: Any = None) -> None:
        """``work(i)`` for i in range(n) over ``threads`` threads. The first exception raised
        (after every thread has stopped) is raised here; ``LoaderError`` when ``stop`` (an
        Event) was set before every part was done (each thread checks it before each)."""
        counter = itertools.count()  # next() on it is atomic
        # set by the first part that fails: a list (appending is atomic, and nobody waits on
        # it), not an Event, whose making would cost a read in the loop's thread as much
        failed: list[bool] = []
        closes = self._closes

        def share(helper: bool) -> None:
            try:
                while not failed and not (helper and self._closes != closes):
                    if stop is not None and stop.is_set():
                        raise LoaderError(CLOSED)
                    i = next(counter)
                    if i >= n:
                        return
                    work(i)
            except BaseException:
                failed.append(True)
                raise

        if min(threads, n) <= 1:  # one thread, or one part: this one, with nothing to join
            return share(False)
        futures: list = []
        with contextlib.suppress(RuntimeError):  # interpreter exit: no new threads, all here
            futures = [self._executor.submit(share, True) for _ in range(min(threads, n) - 1)]
        try:  # this thread's own error first, after every helper has stopped
            share(False)  # (a helper stopped by close() leaves its parts to this one)
        finally:  # a helper not started yet has nothing to finish: not waited for
            errors = [f.exception() for f in futures if not f.cancel()]
        for error in filter(None, errors):  # else the first a helper raised
            raise error

    def close(self) -> None:
        """Stop the threads (parts under way finish) and join them; the next run starts
        others."""
        self._closes += 1
        old = self._executor
        self._executor = ThreadPoolExecutor(_MOST_HELPERS, POOL_THREAD_NAME)
        old.shutdown(wait=True)


POOL = Pool()
if hasattr(os, "register_at_fork"):  # (no fork, nothing to do: Windows)
    os.register_at_fork(after_in_child=POOL.__init__)  # a forked child's pool starts empty
# Whatever has a thread that may be running, and the name of its method that stops it.
# Weak: a thread's target keeps its owner alive while it runs, and an owner that is gone
# has no thread left to stop.
_owners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def close_at_exit(owner: Any, stop: str = "close") -> None:
    """Call ``owner.close()`` (or the method named ``stop``) at exit (see the module
    docstring), unless forgotten first."""
    _owners[owner] = stop


def forget_at_exit(owner: Any) -> None:
    _owners.pop(owner, None)


@atexit.register
def _close_all() -> None:
    for owner, stop in list(_owners.items()):
        getattr(owner, stop)()
    POOL.close()


class Demand:
    """How many loaders of this process wait for a batch right now: a loader counts itself
    in (``add(1)``) from being asked for a batch it does not have until it has one
    (``add(-1)``); the page-cache warm pauses while the count is above 0 (``wait_idle``).
    ``add(0)`` wakes every paused warm, to see its stop flag."""

    def __init__(self) -> None:
        self._cond, self._count = threading.Condition(threading.Lock()), 0

    def add(self, n: int) -> None:
        with self._cond:
            self._count += n
            if self._count <= 0 or n == 0:  # only a count of 0 (or a stop) wakes a warm
                self._cond.notify_all()

    def wait_idle(self, stop: threading.Event) -> None:
        """Return once nobody waits for a batch, or ``stop`` is set."""
        with self._cond:
            while self._count > 0 and not stop.is_set():
                self._cond.wait(_LIVENESS_S)


DEMAND = Demand()


# -- in this process -------------------------------------------------------------------------


class InProcess:
    """Batches of the read stage ``read`` over each pass's plan, read in this process (see
    the module docstring). ``hint``: announces a batch's reads to the kernel (the batch
    after each one, before it is read, so that they overlap; only the first batch's reads
    go out alone, so it waits for nothing else). ``timeout``: seconds to wait for a batch
    in the background (None: forever)."""

    def __init__(self, read: Callable[[Any, Any], Any], hint: Any = None, *, prefetch: int,
                 timeout: float | None = None) -> None:  # fmt: skip
        self.read, self.hint = read, hint or (lambda idx: None)
        self.prefetch, self.timeout = prefetch, timeout
        self._active: _Pass | None = None

    def close(self) -> None:
        """Stop the pass under way, if any (its iterator then raises LoaderError)."""
        if self._active is not None:
            self._active.close()

    def batches(self, plan: Iterable[Any]) -> Iterator[Any]:
        self.close()
        self._active = _Pass(self, plan)
        return self._active.batches()

    def _reads(self, plan: Iterable[Any], stop: threading.Event) -> Iterator[Any]:
        plan, tell = iter(plan), self.hint
        cur, first = next(plan, None), True
        if cur is not None:
            tell(cur.records)
        while cur is not None:
            nxt = next(plan, None)
            if nxt is not None and not first:
                tell(nxt.records)
            batch = self.read(cur, stop)
            if nxt is not None and first:
                tell(nxt.records)
            yield batch
            batch, cur, first = None, nxt, False  # hold nothing while the user has the batch


class _Pass:
    """One pass: each batch read in the loop's thread when the loop asks for it
    (``prefetch=0``), or by a daemon thread up to ``prefetch`` batches ahead into a queue,
    which it ends with ``None`` (or the exception that stopped it). The loop counts itself
    in ``DEMAND`` while it waits, from before the thread starts (at its first ask): it alone
    counts, in and out around each wait, so a pass never begun counts nothing. ``close``
    sets the stop; with a thread, it also empties the queue (so a put blocked on a full one
    returns and the thread sees the stop) and puts ``None`` in it, which wakes a consumer
    waiting."""

    def __init__(self, source: InProcess, plan: Iterable[Any]) -> None:
        self.stop, self.timeout, prefetch = threading.Event(), source.timeout, source.prefetch
        self.items = source._reads(plan, self.stop)
        self.ready: queue.Queue | None = queue.Queue(maxsize=prefetch) if prefetch else None
        # the next batch (None: the end), read here, or taken from the thread's queue
        self.take = functools.partial(next, self.items, None)
        self.thread: threading.Thread | None = None
        if prefetch:  # (started by the loop, once it counts itself in: no warm chunk first)
            self.take = functools.partial(self.ready.get, timeout=self.timeout)
            self.thread = threading.Thread(target=self._work, name=THREAD_NAME, daemon=True)
            close_at_exit(self)

    def _work(self) -> None:
        number = 0
        try:
            for batch in self.items:
                if not self._put(batch):
                    return
                batch, number = None, number + 1
            self._put(None)  # the end of the pass
        except BaseException as exc:  # handed to the consumer, which re-raises it
            if hasattr(exc, "add_note"):  # Python 3.11 on
                exc.add_note(f"raised by the in-process loader thread while reading batch {number}")
            self._put(exc)

    def _put(self, item: Any) -> bool:
        """Hand ``item`` over, unless stopped; whether to go on."""
        if not self.stop.is_set():
            self.ready.put(item)
        return not self.stop.is_set()

    def batches(self) -> Iterator[Any]:
        try:
            while not self.stop.is_set():  # else closed, or a new pass began: read no more
                # the loop waits for a batch unless one is ready: the warm pauses meanwhile
                waits = self.ready is None or self.ready.empty()
                if waits:  # (add(0) is DEMAND's stop signal: not for a batch that is ready)
                    DEMAND.add(1)
                try:
                    if self.thread is not None and self.thread.ident is None:
                        self.thread.start()
                    item = self.take()
                except queue.Empty:
                    raise LoaderError(f"no batch within timeout={self.timeout} s") from None
                finally:
                    if waits:
                        DEMAND.add(-1)
                if self.stop.is_set():
                    break
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
                item = None  # hold no reference while the user has the batch
            raise LoaderError(CLOSED)
        finally:
            self.close()
            if self.thread is None:
                self.items.close()  # (a thread's reads end with the thread)

    def close(self) -> None:
        """Stop the pass, and join the thread (if it started). A closed pass stays in the
        at-exit table until it is collected: closing it again there does nothing."""
        self.stop.set()
        if self.thread is None:
            return
        with contextlib.suppress(queue.Empty):
            while True:
                self.ready.get_nowait()
        with contextlib.suppress(queue.Full):
            self.ready.put_nowait(None)
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=_JOIN_S)


# -- a torch DataLoader ----------------------------------------------------------------------


def _one_line(exc: ImgpackError) -> ImgpackError:
    """An imgpack error torch re-raised from a worker ("Caught X in DataLoader worker process
    N. Original Traceback ...") as the line it was raised with."""
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    prefix = f"{type(exc).__name__}: "  # the traceback's last line: [module.]Name: message
    if len(lines) < 2 or prefix not in lines[-1]:
        return exc
    clean = type(exc)(lines[-1].split(prefix, 1)[1])
    if hasattr(clean, "add_note"):  # Python 3.11 on
        clean.add_note(f"raised in a DataLoader worker process ({lines[0].rstrip('.')})")
    return clean


class Workers:
    """Batches made by a torch DataLoader (module docstring): the read stage ``read`` (any
    of ``imgpack.reader.read``'s, ``Samples`` among them) of each whole ``Batch`` request
    of ``plan``. The read stage is the DataLoader's dataset: ``read[request]`` is the batch
    read (a map-style dataset needs no ``len`` where a sampler is given)."""

    def __init__(self, plan: Any, kw: dict[str, Any], read: Any) -> None:
        # batch_size=None: each item is a whole ``Batch``, which the default convert leaves as
        # it is (and its ``pin_memory`` pins it)
        self._kw, self._read = {**kw, "sampler": plan, "batch_size": None}, read
        self._passes = self._closes = 0

    @functools.cached_property
    def dataloader(self) -> DataLoader:
        """Made at the first pass, and again after ``close``."""
        return DataLoader(self._read, **self._kw)

    def close(self) -> None:
        """Drop the DataLoader: torch shuts its persistent workers down with it."""
        self._closes += 1  # a pass under way ends at its next batch
        self.__dict__.pop("dataloader", None)  # (functools.cached_property's own slot)

    def batches(self, plan: Iterable[Any]) -> Iterator[Any]:
        """The DataLoader's items for one pass, which ends (LoaderError) when the loader is
        closed, or when a newer pass begins on persistent workers (torch then resets the one
        iterator they serve, and the older pass would take the newer one's batches); an
        error ends the workers too."""
        self._passes += 1
        mine, closes = self._passes, self._closes
        shared = self.dataloader.persistent_workers and self.dataloader.num_workers > 0
        items = iter(self.dataloader)  # (a local reference would outlive close())
        while True:
            if self._closes != closes or (shared and self._passes != mine):
                raise LoaderError(CLOSED)
            try:
                item = next(items)
            except BaseException as exc:
                # torch's frames in the traceback refer to its iterator: cleared, and the
                # iterator let go, the workers are shut down now, by refcount, while their
                # queues still work (left to the garbage collector, the queues are closed
                # before the iterator asks the workers to stop, and it waits 5 s for each)
                traceback.clear_frames(exc.__traceback__)
                items = None
                ended = isinstance(exc, StopIteration)  # a worker's ends the pass, as in torch
                if not ended or "in DataLoader worker process" in str(exc):
                    self.close()
                if ended:
                    return
                if isinstance(exc, ImgpackError):
                    raise _one_line(exc) from None
                raise
            yield item
            item = None
