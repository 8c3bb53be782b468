"""One pass of the in-process loader in a background thread: its queue, helpers and end.

``InProcessLoader`` starts a ``Run`` per pass over batches of 1 MiB or more. The thread
gathers each batch (split over ``threads`` helper threads unless the queue is full) and
queues it; the consumer takes batches with ``next_item``; ``close`` stops and joins the
threads, also when the main thread is done (``imgpack.reader.threads``). While the consumer
waits for a batch the page-cache warm pauses (``warm.DEMAND``).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np
import torch

from imgpack.errors import LoaderError
from imgpack.reader import threads as lifetime
from imgpack.reader.buffers import pinned
from imgpack.reader.indices import _samples
from imgpack.reader.scaled import Planned
from imgpack.reader.warm import DEMAND

__all__ = ["Run", "THREAD_NAME", "CLOSED"]

THREAD_NAME = "imgpack-inprocess-loader"
CLOSED = "the in-process loader was closed, or a new pass over it began (one pass at a time)"
_LIVENESS_S = 2.0  # how often a blocked wait wakes to check the other side is still there
_JOIN_S = 10.0  # how long closing waits for a gather in progress to finish
_END, _ERROR = "end", "error"
# From a pack that may be cold, a thread copies this much between checks for close().
_CHUNK_BYTES = 4 << 20


class Run:
    """One pass: the thread, its queue, and the consumer's side. ``loader`` is the
    ``InProcessLoader`` whose dataset, buffers and settings the pass uses."""

    def __init__(self, loader: Any, plan: Iterator[Any]) -> None:
        self.loader = loader
        self.ready: queue.Queue = queue.Queue(maxsize=loader.prefetch)
        self.stop = threading.Event()
        self.fetching: np.ndarray | None = None  # the batch being gathered (for error notes)
        self.pool = (
            ThreadPoolExecutor(loader.threads - 1, thread_name_prefix=f"{THREAD_NAME}-helper")
            if loader.threads > 1 and loader.collate is None and not loader.decodes
            else None
        )
        self.thread = threading.Thread(target=self._work, args=(plan,), name=THREAD_NAME)
        # the consumer is about to ask for the first batch: no warm chunk goes before it
        self._asking_lock = threading.Lock()
        self.asking = False
        self._ask(True)
        self.serves = threading.current_thread()  # the consumer's
        lifetime.watch(self, serves=self.serves)
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

    def _work(self, plan: Iterator[Any]) -> None:
        number = 0
        try:
            for item in self.loader.announced(plan, self._fetch):
                if self.stop.is_set() or not self._put(item):
                    return
                number += 1
            if not self.stop.is_set():
                self._put((_END, None))
        except BaseException as exc:  # handed to the consumer, which re-raises it
            self._put((_ERROR, (exc, number, self.fetching)))

    def _fetch(self, item: Any) -> tuple[Any, ...] | None:
        loader = self.loader
        self.fetching = item.idx if isinstance(item, Planned) else np.asarray(item, np.int64)
        if loader.collate is not None:  # per-sample work (the dataset has a transform)
            batch = loader.collate(_samples(loader.dataset, self.fetching))
            return pinned(batch) if loader.pin_memory else batch
        return loader.batch(item, self._gather)

    def _gather(self, idx: np.ndarray, images: np.ndarray, labels: np.ndarray, scales: Any) -> bool:
        """Fill the buffers with records ``idx``, split over the helpers (a JPEG pack: over
        the decode pool's threads, each record at ``scales``); False if stopped.

        From a pack not known to be in the page cache each thread copies ``_CHUNK_BYTES`` at a
        time and checks for close() between chunks, so that Ctrl-C or the end of the script
        never waits for a whole batch read from slow storage.
        """
        loader, n = self.loader, idx.size
        ds = loader.dataset
        # With the queue full the consumer is well served: one thread, the other cores stay
        # the consumer's. Otherwise (it waits, or soon will) every thread copies a share.
        hurry = self.ready.qsize() < loader.prefetch
        parts = min(loader.threads, n) if self.pool is not None and hurry else 1
        decoders = loader.threads if hurry else 1
        cuts = [n * k // parts for k in range(parts + 1)]
        # a record's bytes: a canvas slot, or (packed: records of many sizes) their mean
        rows = n if ds.resident else max(1, _CHUNK_BYTES * n // max(1, images.nbytes))

        def copy(a: int, b: int) -> bool:
            for lo in range(a, b, rows):
                if self.stop.is_set():
                    return False
                hi = min(b, lo + rows)
                d = None if scales is None else scales[lo:hi]
                loader.copy(idx[lo:hi], images[lo:hi], labels[lo:hi], d, decoders)
            return True

        try:
            futures = [self.pool.submit(copy, a, b) for a, b in zip(cuts[1:-1], cuts[2:])]
        except RuntimeError:  # the pool is shut down (interpreter exit): copy it all here
            futures, cuts = [], [0, n]
        done = copy(0, cuts[1])
        for future in futures:
            while True:  # a chunk always ends; waking up only to notice close()
                try:
                    done = future.result(timeout=_LIVENESS_S) and done
                    break
                except FutureTimeout:
                    if self.stop.is_set():
                        return False
        return done

    # --- the consumer ------------------------------------------------------------------

    def _ask(self, asking: bool) -> None:
        """Say whether the consumer is waiting for a batch (the warm pauses while it is)."""
        with self._asking_lock:
            if asking != self.asking:
                self.asking = asking
                DEMAND.add() if asking else DEMAND.release()

    def next_item(self) -> tuple[Any, torch.Tensor] | None:
        if self.stop.is_set():
            raise LoaderError(CLOSED)
        if self.ready.empty():
            self._ask(True)
        try:
            item, extra = self._wait()
        finally:
            self._ask(False)
        if isinstance(item, str) and item == _END:
            return None
        if isinstance(item, str) and item == _ERROR:
            exc, number, idx = extra
            where = "the first batch" if idx is None else f"batch {number} ({idx.size} rows)"
            note = f"raised in imgpack's in-process loader thread while gathering {where}"
            if hasattr(exc, "add_note"):
                exc.add_note(note)
            raise exc
        return item, extra

    def _wait(self) -> tuple[Any, Any]:
        loader = self.loader
        deadline = None if loader.timeout is None else time.monotonic() + loader.timeout
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
                    raise LoaderError(f"no batch within timeout={loader.timeout} s") from None

    def close(self) -> None:
        """Stop and join the threads (also at interpreter exit: ``imgpack.reader.threads``)."""
        self.stop.set()
        lifetime.unwatch(self)
        self._ask(False)
        try:  # make room so that a thread blocked on a full queue notices the stop
            while True:
                self.ready.get_nowait()
        except queue.Empty:
            pass
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=_JOIN_S)
        if self.pool is not None:
            self.pool.shutdown(wait=not self.thread.is_alive())
