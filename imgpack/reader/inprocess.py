"""The in-process fast path: a background thread gathers batches into reusable buffers.

A packed dataset needs no decoding, so a batch is just a gather of records from the
mapped file. Worker processes would then only add cost: every batch crosses a process
boundary through shared memory and is copied again. Here a daemon thread calls
``ds.gather(indices, out_images=buffer)`` straight into a ring of preallocated buffers
(pinned when CUDA is available) while the training step runs; numpy releases the GIL
during large copies, so the two overlap. With ``threads > 1`` each batch is split into
that many row ranges gathered at once by helper threads: one thread copying random
150 KB records reaches about half of memcpy bandwidth, two reach nearly all of it
(docs/benchmarks.md).

Lifetime of a yielded batch: its tensors are views of a ring buffer. A batch stays intact
while the next ``keep`` batches are fetched and may be overwritten after that (default
``keep=1``: the previous batch is still intact while you hold the current one, which covers
look-ahead prefetchers). With pinned buffers, a slot is handed back with a CUDA event
recorded on the current stream, and the thread waits for that event before overwriting it,
so ``images.to(device, non_blocking=True)`` on the current stream is safe. Pass
``copy=True`` to get fresh tensors you may keep (``list(loader)``), at one extra copy per
batch.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np
import torch

from imgpack.errors import LoaderConfigError, LoaderError

__all__ = ["InProcessLoader", "THREAD_NAME", "DEFAULT_PREFETCH", "DEFAULT_KEEP"]

THREAD_NAME = "imgpack-inprocess-loader"
DEFAULT_PREFETCH = 2  # batches gathered ahead of the consumer
DEFAULT_KEEP = 1  # earlier batches that stay valid while the consumer holds the current one
_LIVENESS_S = 2.0  # how often a blocked wait wakes to check the other side is still there
_JOIN_S = 10.0  # how long closing waits for a gather in progress to finish

_STOP, _END, _ERROR = "stop", "end", "error"


class _Slot:
    """One reusable batch buffer: torch tensors and numpy views of the same memory."""

    def __init__(self, rows: int, shape: tuple[int, int, int], pin: bool) -> None:
        self.rows = rows
        self.images = torch.empty((rows, *shape), dtype=torch.uint8, pin_memory=pin)
        self.labels = torch.empty((rows,), dtype=torch.int64, pin_memory=pin)
        self.images_np = self.images.numpy()
        self.labels_np = self.labels.numpy()
        self.event: Any = None  # CUDA event to wait for before reuse


class _Run:
    """One pass: the thread, its queues, and the consumer's bookkeeping."""

    def __init__(self, loader: InProcessLoader, plan: Iterator[Any]) -> None:
        self.loader = loader
        self.slots = loader._slots  # shared with later passes, never with a concurrent one
        depth = len(self.slots)
        self.free: queue.Queue = queue.Queue()
        for i in range(depth):
            self.free.put(i)
        self.ready: queue.Queue = queue.Queue(maxsize=depth + 1)
        self.stop = threading.Event()
        self.held: deque[int] = deque()
        self.pool = (
            ThreadPoolExecutor(loader.threads - 1, thread_name_prefix=f"{THREAD_NAME}-helper")
            if loader.threads > 1
            else None
        )
        self.thread = threading.Thread(
            target=self._work, args=(plan,), name=THREAD_NAME, daemon=True
        )
        self.thread.start()

    # --- the background thread ---------------------------------------------------------

    def _free_slot(self) -> int | None:
        while True:
            try:
                slot = self.free.get(timeout=_LIVENESS_S)
            except queue.Empty:
                if self.stop.is_set():
                    return None
                continue
            return None if slot == _STOP or self.stop.is_set() else slot

    def _work(self, plan: Iterator[Any]) -> None:
        loader, number, idx = self.loader, 0, None
        try:
            cur = next(plan, None)
            hints = loader.prefetch_hints and hasattr(loader.dataset, "will_need")
            if hints and cur is not None:
                loader.dataset.will_need(np.asarray(cur))
            while cur is not None and not self.stop.is_set():
                idx = np.asarray(cur, dtype=np.int64)
                nxt = next(plan, None)
                if hints and nxt is not None:
                    loader.dataset.will_need(np.asarray(nxt))
                slot = self._free_slot()
                if slot is None:
                    return
                buf = self._slot_for(slot, idx.size)
                if buf.event is not None:
                    buf.event.synchronize()  # the consumer's async copy out of it is done
                    buf.event = None
                if not self._gather(idx, buf):
                    return
                self.ready.put((slot, idx.size))
                cur, number = nxt, number + 1
            self.ready.put((_END, 0))
        except BaseException as exc:  # handed to the consumer, which re-raises it
            self.ready.put((_ERROR, (exc, number, idx)))

    def _gather(self, idx: np.ndarray, buf: _Slot) -> bool:
        """Fill ``buf`` with records ``idx``, split over the helper threads; False if stopped."""
        gather, n = self.loader.dataset.gather, idx.size
        parts = min(self.loader.threads, n) if self.pool is not None else 1
        cuts = [n * k // parts for k in range(parts + 1)]
        futures = [
            self.pool.submit(
                gather, idx[a:b], out_images=buf.images_np[a:b], out_labels=buf.labels_np[a:b]
            )
            for a, b in zip(cuts[1:-1], cuts[2:])
        ]
        a = cuts[1]
        gather(idx[:a], out_images=buf.images_np[:a], out_labels=buf.labels_np[:a])
        for future in futures:
            while True:  # a copy always ends; waking up only to notice close()
                try:
                    future.result(timeout=_LIVENESS_S)
                    break
                except FutureTimeout:
                    if self.stop.is_set():
                        return False
        return True

    def _slot_for(self, i: int, rows: int) -> _Slot:
        """Slot ``i`` with room for ``rows`` records; allocated on first use, grown if needed."""
        buf = self.slots[i]
        if buf is None or buf.rows < rows:
            buf = _Slot(rows, tuple(self.loader.dataset.shape), self.loader.pin_memory)
            self.slots[i] = buf
        return buf

    # --- the consumer ------------------------------------------------------------------

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        loader = self.loader
        if self.stop.is_set():
            raise LoaderError("the in-process loader was closed")
        while len(self.held) > loader.keep:
            self._release(self.held.popleft())
        deadline = None if loader.timeout is None else time.monotonic() + loader.timeout
        while True:
            wait = _LIVENESS_S if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                slot, size = self.ready.get(timeout=min(_LIVENESS_S, wait))
                break
            except queue.Empty:
                if self.stop.is_set():
                    raise LoaderError("the in-process loader was closed") from None
                if not self.thread.is_alive() and self.ready.empty():
                    raise LoaderError("in-process loader thread stopped without a batch") from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise LoaderError(f"no batch within timeout={loader.timeout} s") from None
        if slot == _END:
            return None
        if slot == _ERROR:
            exc, number, idx = size
            where = "the first batch" if idx is None else f"batch {number} ({idx.size} rows)"
            note = f"raised in imgpack's in-process loader thread while gathering {where}"
            if hasattr(exc, "add_note"):
                exc.add_note(note)
            raise exc
        self.held.append(slot)
        buf = self.slots[slot]
        images = buf.images[:size].permute(0, 3, 1, 2)  # (B,3,H,W), channels_last in memory
        labels = buf.labels[:size]
        if loader.copy:
            return images.clone(), labels.clone()
        return images, labels

    def _release(self, slot: int) -> None:
        if self.loader._cuda_events:
            event = torch.cuda.Event()
            event.record()  # after whatever the consumer queued on the current stream
            self.slots[slot].event = event
        self.free.put(slot)

    def close(self) -> None:
        self.stop.set()
        self.free.put(_STOP)
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=_JOIN_S)
        if self.pool is not None:
            self.pool.shutdown(wait=not self.thread.is_alive())
        if self.thread.is_alive():  # still inside a gather: let it keep its buffers
            self.loader._slots = [None] * len(self.slots)


class InProcessLoader:
    """Batches gathered by a daemon thread (and ``threads - 1`` helpers) into a ring of
    ``prefetch + keep + 1`` buffers.

    ``plan`` is any re-iterable of index arrays (one per batch), iterated once per pass.
    Only one pass runs at a time: starting a new one stops the previous one.
    """

    def __init__(
        self,
        dataset: Any,
        plan: Iterable[Any],
        *,
        prefetch: int = DEFAULT_PREFETCH,
        keep: int = DEFAULT_KEEP,
        pin_memory: bool = False,
        prefetch_hints: bool = True,
        copy: bool = False,
        timeout: float | None = None,
        threads: int = 1,
    ) -> None:
        limits = (("prefetch", prefetch, 1), ("keep", keep, 0), ("threads", threads, 1))
        for name, value, low in limits:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise LoaderConfigError(f"{name} should be an integer >= {low}, found {value!r}")
        if timeout is not None and not timeout > 0:
            raise LoaderConfigError(f"timeout should be > 0 seconds or None, found {timeout!r}")
        if not hasattr(dataset, "gather"):
            raise LoaderConfigError(
                f"in-process mode needs a dataset with gather(), found {type(dataset).__name__}"
            )
        if pin_memory and not torch.cuda.is_available():
            raise LoaderConfigError("pin_memory=True needs CUDA, which this torch build lacks")
        self.dataset, self.plan = dataset, plan
        self.prefetch, self.keep = prefetch, keep
        self.pin_memory, self.prefetch_hints = bool(pin_memory), bool(prefetch_hints)
        self.copy, self.timeout, self.threads = bool(copy), timeout, threads
        self._cuda_events = self.pin_memory
        self._slots: list[_Slot | None] = [None] * (prefetch + keep + 1)
        self._active: _Run | None = None

    def close(self) -> None:
        """Stop the pass under way, if any (its iterator then raises LoaderError)."""
        if self._active is not None:
            self._active.close()
            self._active = None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.close()
        run = _Run(self, iter(self.plan))
        self._active = run
        try:
            while True:
                batch = run.next_batch()
                if batch is None:
                    return
                yield batch
        finally:
            run.close()
            if self._active is run:
                self._active = None
