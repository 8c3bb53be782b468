"""The read stage run in this process: in the loop's own thread, or one thread ahead of it.

``InProcess`` runs a source of batches (``reading``: the read stage over the plan, or the
per-sample source of ``workers.Samples``) in one of two ways, chosen when the loader is
built:

inline     (``prefetch=0``) the batch is read in the loop's thread when the loop asks for
           it, as a hand-written loop reads it. A copy is memory-bound: a second thread that
           overlaps it with a consumer's own copy on the same memory bus does not make
           either faster, and beside the consumer's torch threads it slows both. Reads of
           the next batch are announced to the kernel first (``hint``), so a cold pack's
           pages still come in while the step runs.
background (``prefetch=N``) a daemon thread reads up to ``prefetch`` batches ahead into a
           queue: where the consumer is a GPU (its copy is DMA, not CPU work) or the read is
           a decode, that overlap is where the time goes. It is stopped and joined when the
           pass ends, when the loader is closed, and at exit (``imgpack.reader.threads``).

Either way the first batch's reads go out alone, so it waits for nothing else, and while the
loop waits for a batch the page-cache warm pauses (``warm.DEMAND``).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from imgpack.errors import LoaderError
from imgpack.reader import threads
from imgpack.reader.batch import Batch
from imgpack.reader.threads import Stopped
from imgpack.reader.warm import DEMAND

__all__ = ["InProcess", "reading", "THREAD_NAME", "CLOSED"]

THREAD_NAME = "imgpack-loader"
CLOSED = "the loader was closed, or a new pass over it began (one pass at a time)"
_LIVENESS_S = 2.0  # how often a blocked wait wakes to check the other side is still there
_JOIN_S = 10.0  # how long closing waits for a read in progress to finish

Source = Callable[[Iterable[Batch], threading.Event], Iterator[Batch]]


def reading(
    read: Callable[[Batch, threading.Event], Batch],
    hint: Callable[[np.ndarray], None] | None = None,
) -> Source:
    """The read stage over a pass's plan: the reads of the batch after each one announced to
    the kernel (``hint``) before it is read, so that they overlap; only the first batch's
    reads go out alone, so it waits for nothing else."""

    def batches(plan: Iterable[Batch], stop: threading.Event) -> Iterator[Batch]:
        plan, tell = iter(plan), hint or (lambda idx: None)
        cur, first = next(plan, None), True
        if cur is not None:
            tell(cur.records)
        while cur is not None:
            nxt = next(plan, None)
            if nxt is not None and not first:
                tell(nxt.records)
            batch = read(cur, stop)
            if nxt is not None and first:
                tell(nxt.records)
            yield batch
            batch, cur, first = None, nxt, False  # hold nothing while the user has the batch

    return batches


class InProcess:
    """Batches of a source, read in this process (see the module docstring).

    ``source(plan, stop)`` yields the batches of one pass. One pass runs at a time:
    starting a new one stops the previous one, whose iterator then raises LoaderError.
    ``timeout``: seconds to wait for a batch in the background (None: forever).
    """

    def __init__(self, source: Source, *, prefetch: int, timeout: float | None = None) -> None:
        self.source, self.prefetch, self.timeout = source, prefetch, timeout
        self._stop = threading.Event()
        self._active: _Run | None = None

    def close(self) -> None:
        """Stop the pass under way, if any (its iterator then raises LoaderError)."""
        self._stop.set()
        if self._active is not None:
            self._active.close()

    def batches(self, plan: Iterable[Batch]) -> Iterator[Batch]:
        self.close()
        self._stop = stop = threading.Event()
        if self.prefetch == 0:
            return self._inline(plan, stop)
        self._active = _Run(self, plan, stop)
        return self._active.batches()

    def _inline(self, plan: Iterable[Batch], stop: threading.Event) -> Iterator[Batch]:
        items = self.source(plan, stop)
        try:
            while True:
                if stop.is_set():  # closed, or a new pass began: read nothing more
                    raise LoaderError(CLOSED)
                DEMAND.add()  # the loop asked for this batch: no warm chunk first
                try:
                    batch = next(items)
                except StopIteration:
                    return
                except Stopped:
                    raise LoaderError(CLOSED) from None
                finally:
                    DEMAND.release()
                if stop.is_set():
                    raise LoaderError(CLOSED)
                yield batch
                batch = None  # noqa: F841 - hold no reference while the user has the batch
        finally:
            items.close()


class _Run:
    """One background pass: the daemon thread, its queue, and the consumer's side."""

    def __init__(self, owner: InProcess, plan: Iterable[Batch], stop: threading.Event) -> None:
        self.source, self.timeout, self.stop = owner.source, owner.timeout, stop
        self.ready: queue.Queue = queue.Queue(maxsize=owner.prefetch)
        self.asking = True  # the consumer is about to ask for the first batch
        DEMAND.add()
        self._lock = threading.Lock()
        self.thread = threading.Thread(
            target=self._work, args=(plan,), name=THREAD_NAME, daemon=True
        )
        threads.close_at_exit(self)
        self.thread.start()

    def _work(self, plan: Iterable[Batch]) -> None:
        number = 0
        try:
            for batch in self.source(plan, self.stop):
                if not self._put(batch):
                    return
                batch, number = None, number + 1
            self._put(None)  # the end of the pass
        except Stopped:
            return
        except BaseException as exc:  # handed to the consumer, which re-raises it
            if hasattr(exc, "add_note"):  # Python 3.11 on
                exc.add_note(
                    f"raised in imgpack's in-process loader thread while reading batch {number}"
                )
            self._put(exc)

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.ready.put(item, timeout=_LIVENESS_S)
                return True
            except queue.Full:
                pass
        return False

    def _ask(self, asking: bool) -> None:
        """Say whether the consumer is waiting for a batch (the warm pauses while it is)."""
        with self._lock:
            if asking != self.asking:
                self.asking = asking
                DEMAND.add() if asking else DEMAND.release()

    def batches(self) -> Iterator[Batch]:
        try:
            while True:
                if self.ready.empty():
                    self._ask(True)
                try:
                    item = self._wait()
                finally:
                    self._ask(False)
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
                item = None  # hold no reference while the user has the batch
        finally:
            self.close()

    def _wait(self) -> Any:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            if self.stop.is_set():
                raise LoaderError(CLOSED)
            wait = _LIVENESS_S if deadline is None else deadline - time.monotonic()
            try:
                return self.ready.get(timeout=max(0.0, min(_LIVENESS_S, wait)))
            except queue.Empty:
                if not self.thread.is_alive() and self.ready.empty() and not self.stop.is_set():
                    raise LoaderError("in-process loader thread stopped without a batch") from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise LoaderError(f"no batch within timeout={self.timeout} s") from None

    def close(self) -> None:
        """Stop and join the thread."""
        self.stop.set()
        threads.forget_at_exit(self)
        self._ask(False)
        try:  # make room so that a thread blocked on a full queue notices the stop
            while True:
                self.ready.get_nowait()
        except queue.Empty:
            pass
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=_JOIN_S)
