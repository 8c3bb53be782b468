"""The read stage run in this process: in the loop's own thread, or one thread ahead of it.

``InProcess`` runs a source of batches (``Reading``: the read stage over the plan, or the
per-sample source of ``workers.Samples``) in one of two ways, chosen when the loader is
built:

inline     (``prefetch=0``) the batch is read in the loop's thread when the loop asks for
           it, as a hand-written loop reads it. A copy is memory-bound: a second thread that
           overlaps it with a consumer's own copy on the same memory bus does not make
           either faster, and beside the consumer's torch threads it slows both. Reads of
           the next batch are announced to the kernel first (``will_need``), so a cold
           pack's pages still come in while the step runs.
background (``prefetch=N``) a thread reads up to ``prefetch`` batches ahead into a queue:
           where the consumer is a GPU (its copy is DMA, not CPU work) or the read is a
           decode, that overlap is where the time goes.

Either way the first batch's reads go out alone, so it waits for nothing else, and while the
loop waits for a batch the page-cache warm pauses (``warm.DEMAND``).

A batch handed out belongs to the user: image buffers come from ``BufferPool``, which
reuses one only when nothing references it any more. The thread is stopped and joined
before the interpreter exits (``imgpack.reader.threads``), so a script that ends holding an
iterator exits cleanly.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

from imgpack.errors import LoaderError
from imgpack.reader import threads
from imgpack.reader.batch import Batch
from imgpack.reader.threads import Stopped
from imgpack.reader.warm import DEMAND

__all__ = ["InProcess", "Reading", "BufferPool", "THREAD_NAME", "CLOSED"]

THREAD_NAME = "imgpack-loader"
CLOSED = "the in-process loader was closed, or a new pass over it began (one pass at a time)"
_LIVENESS_S = 2.0  # how often a blocked wait wakes to check the other side is still there
_JOIN_S = 10.0  # how long closing waits for a read in progress to finish
_END, _ERROR = "end", "error"


def _free_refs() -> int:
    """What ``sys.getrefcount`` reports for an array referenced by a list only (the
    interpreter decides how many temporaries it counts, so measure rather than assume)."""
    held = [np.empty(0)]
    return sys.getrefcount(held[0])


_FREE_REFS = _free_refs()


class BufferPool:
    """Buffers for batches (uint8 images, or a ``dtype``'s that numpy holds: not bfloat16),
    each reused only once nobody references it; a free buffer of a shape no longer asked for
    is replaced by one that is.

    On the CPU a buffer is a numpy array that every tensor (and every view of one) handed
    out keeps alive, so its reference count says whether the user still holds any part of
    it. Pinned buffers are fresh from torch's caching host allocator instead, which reuses
    a block only once it is freed and every async copy out of it, on any stream, is done.
    """

    def __init__(
        self, limit: int, pin_memory: bool = False, dtype: torch.dtype = torch.uint8
    ) -> None:
        self.limit, self.pin_memory, self.dtype = limit, pin_memory, dtype
        self.bases: list[np.ndarray] = []
        self.allocated = 0  # buffers made so far (tests and benchmarks read it)

    def take(
        self, rows: int, shape: tuple[int, ...], bound: tuple[int, ...] | None = None
    ) -> tuple[torch.Tensor, np.ndarray]:
        """A (rows, *shape) buffer nothing else refers to: (the tensor to hand out, a
        numpy view of it to fill). ``bound``: the largest ``shape`` batches may have (a
        canvas sized per batch, no larger): buffers are kept at the bound and reused for
        any shape within it, as a contiguous prefix."""
        keep = tuple(shape) if bound is None else tuple(bound)
        if self.pin_memory:
            # Hand out this very tensor (not a from_numpy copy of its pointer): the
            # allocator tracks copies by the tensor's own storage.
            self.allocated += 1
            t = torch.empty((rows, *shape), dtype=self.dtype, pin_memory=True)
            return t, t.numpy()
        stale = None  # a free buffer of another shape: replaced once the pool is full
        for k in range(len(self.bases)):
            if sys.getrefcount(self.bases[k]) <= _FREE_REFS:  # more: a batch still alive
                base = self.bases[k]
                if base.shape[0] >= rows and base.shape[1:] == keep:
                    view = _prefix(base, rows, shape)
                    return torch.from_numpy(view), view
                stale = k
        self.allocated += 1
        base = torch.empty((rows, *keep), dtype=self.dtype).numpy()  # torch's allocator
        if len(self.bases) < self.limit:
            self.bases.append(base)
        elif stale is not None:  # the batches' shape changed (a new size, a larger batch)
            self.bases[stale] = base
        view = _prefix(base, rows, shape)
        return torch.from_numpy(view), view


def _prefix(base: np.ndarray, rows: int, shape: tuple[int, ...]) -> np.ndarray:
    """``base``'s first bytes as a contiguous (rows, *shape) array (a view)."""
    if base.shape[1:] == tuple(shape):
        return base[:rows]
    return base.reshape(-1)[: rows * int(np.prod(shape))].reshape(rows, *shape)


class Reading:
    """The read stage over a pass's plan: each batch read by ``read``, the reads of the
    batch after it announced to the kernel (``hint``) before it is read, so that they
    overlap; only the first batch's reads go out alone, so it waits for nothing else."""

    def __init__(
        self,
        read: Callable[[Batch, threading.Event | None], Batch],
        hint: Callable[[np.ndarray], None] | None = None,
    ) -> None:
        self.read, self.hint = read, hint

    def __call__(self, plan: Iterable[Batch], stop: threading.Event) -> Iterator[Batch]:
        plan = iter(plan)
        hint = self.hint or (lambda idx: None)
        cur, first = next(plan, None), True
        if cur is not None:
            hint(cur.records)
        while cur is not None:
            nxt = next(plan, None)
            if nxt is not None and not first:
                hint(nxt.records)
            batch = self.read(cur, stop)
            if nxt is not None and first:
                hint(nxt.records)
            yield batch
            batch = None  # noqa: F841 - hold no reference while the user has the batch
            cur, first = nxt, False


class InProcess:
    """Batches of a source, read in this process (see the module docstring).

    ``source(plan, stop)`` yields the batches of one pass. One pass runs at a time:
    starting a new one stops the previous one, whose iterator then raises LoaderError.
    ``timeout``: seconds to wait for a batch in the background (None: forever).
    """

    def __init__(
        self,
        source: Callable[[Iterable[Batch], threading.Event], Iterator[Batch]],
        *,
        prefetch: int,
        timeout: float | None = None,
    ) -> None:
        self.source, self.prefetch, self.timeout = source, prefetch, timeout
        self._stop = threading.Event()
        self._active: _Run | None = None

    def close(self) -> None:
        """Stop the pass under way, if any (its iterator then raises LoaderError)."""
        self._stop.set()
        if self._active is not None:
            self._active.close()
            self._active = None

    def batches(self, plan: Iterable[Batch]) -> Iterator[Batch]:
        self.close()
        self._stop = stop = threading.Event()
        if self.prefetch == 0:
            return self._inline(plan, stop)
        return self._background(plan, stop)

    def _inline(self, plan: Iterable[Batch], stop: threading.Event) -> Iterator[Batch]:
        items = self.source(plan, stop)
        try:
            while True:
                if stop.is_set():  # closed, or a new pass began: read nothing more
                    raise LoaderError(CLOSED)
                with DEMAND.waiting():  # the loop asked for this batch: no warm chunk first
                    try:
                        batch = next(items)
                    except StopIteration:
                        return
                    except Stopped:
                        raise LoaderError(CLOSED) from None
                if stop.is_set():
                    raise LoaderError(CLOSED)
                yield batch
                batch = None  # noqa: F841 - hold no reference while the user has the batch
        finally:
            items.close()

    def _background(self, plan: Iterable[Batch], stop: threading.Event) -> Iterator[Batch]:
        run = _Run(self, plan, stop)
        self._active = run
        try:
            while True:
                batch = run.next_batch()
                if batch is None:
                    return
                yield batch
                batch = None  # noqa: F841 - hold no reference while the user has the batch
        finally:
            run.close()
            if self._active is run:
                self._active = None


class _Run:
    """One background pass: the thread, its queue, and the consumer's side."""

    def __init__(self, owner: InProcess, plan: Iterable[Batch], stop: threading.Event) -> None:
        self.owner, self.stop = owner, stop
        self.ready: queue.Queue = queue.Queue(maxsize=owner.prefetch)
        self.thread = threading.Thread(target=self._work, args=(plan,), name=THREAD_NAME)
        self._asking_lock = threading.Lock()
        self.asking = False
        self._ask(True)  # the consumer is about to ask for the first batch
        self.serves = threading.current_thread()  # the consumer's
        threads.close_at_exit(self, serves=self.serves)
        self.thread.start()

    # --- the background thread ---------------------------------------------------------

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.ready.put(item, timeout=_LIVENESS_S)
                return True
            except queue.Full:
                if not self.serves.is_alive():  # its consumer thread ended holding the pass
                    return False
        return False

    def _work(self, plan: Iterable[Batch]) -> None:
        number = 0
        try:
            for batch in self.owner.source(plan, self.stop):
                if self.stop.is_set() or not self._put(batch):
                    return
                batch = None
                number += 1
            if not self.stop.is_set():
                self._put((_END, None))
        except Stopped:
            return
        except BaseException as exc:  # handed to the consumer, which re-raises it
            self._put((_ERROR, (exc, number)))

    # --- the consumer ------------------------------------------------------------------

    def _ask(self, asking: bool) -> None:
        """Say whether the consumer is waiting for a batch (the warm pauses while it is)."""
        with self._asking_lock:
            if asking != self.asking:
                self.asking = asking
                DEMAND.add() if asking else DEMAND.release()

    def next_batch(self) -> Batch | None:
        if self.stop.is_set():
            raise LoaderError(CLOSED)
        if self.ready.empty():
            self._ask(True)
        try:
            item = self._wait()
        finally:
            self._ask(False)
        if isinstance(item, Batch):
            return item
        kind, extra = item
        if kind == _END:
            return None
        exc, number = extra
        if hasattr(exc, "add_note"):  # Python 3.11 on
            exc.add_note(
                f"raised in imgpack's in-process loader thread while reading batch {number}"
            )
        raise exc

    def _wait(self) -> Any:
        timeout = self.owner.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = _LIVENESS_S if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return self.ready.get(timeout=min(_LIVENESS_S, wait))
            except queue.Empty:
                if self.stop.is_set():
                    raise LoaderError(CLOSED) from None
                if not self.thread.is_alive() and self.ready.empty():
                    raise LoaderError("in-process loader thread stopped without a batch") from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise LoaderError(f"no batch within timeout={timeout} s") from None

    def close(self) -> None:
        """Stop and join the thread (also at interpreter exit: ``imgpack.reader.threads``)."""
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
