"""Listing many source files on every core: one call per file, results in the files' order;
and stopping a process pool in bounded time, which the decoding pool (``parallel``) shares.

A source is listed before anything is decoded, by one process, so on a machine with many
cores a slow listing would cost more than every core's decoding saves: tar headers cost
``tarfile`` some tens of microseconds per member, minutes for ImageNet's 2.5 million. Files
are independent, so each is listed in a worker process and the results are taken back in
order, which keeps the listing a pure function of the files. Workers leave Ctrl-C to the
parent, as the decoding workers do; every wait has a timeout; a failure stops the others.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from multiprocessing.connection import wait as wait_ready
from typing import Any

from imgpack.errors import PackError

__all__ = ["LIST_TIMEOUT_S", "STOP_TIMEOUT_S", "WorkerPool", "map_in_processes"]

LIST_TIMEOUT_S = 600.0  # longest wait for one file's listing: only a hung file system hits it
STOP_TIMEOUT_S = 10.0  # longest wait for a pool's workers to exit


def _ignore_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class WorkerPool(ProcessPoolExecutor):
    """A ``ProcessPoolExecutor`` that knows its worker processes, through the public
    mechanism a pool starts them with: its ``mp_context``, whose ``Process`` is recorded
    here, so that ``stop`` ends them in bounded time. ``method``: "fork" or "spawn" (None:
    fork where available)."""

    def __init__(self, workers: int, method: str | None, initializer, initargs=()) -> None:
        method = method or ("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        base = mp.get_context(method)
        self.processes: list = []
        started = self.processes

        class Context(type(base)):
            def Process(self, *args, **kwargs):  # noqa: N802 - multiprocessing's name
                process = base.Process(*args, **kwargs)
                started.append(process)
                return process

        super().__init__(workers, Context(), initializer=initializer, initargs=initargs)

    def stop(self, *, kill: bool) -> None:
        """Let idle workers exit, or (``kill``) terminate busy ones; one that ignores it is
        killed at the deadline (``STOP_TIMEOUT_S``): no work is worth a hang. Both pools of
        the packer stop this way, the listing's and the decoders'."""
        if kill:
            for p in self.processes:
                p.terminate()
        else:  # idle workers exit once told to
            self.shutdown(wait=False, cancel_futures=True)
        live = {p.sentinel: p for p in self.processes if p.pid is not None}
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while live and time.monotonic() < deadline:
            for s in wait_ready(list(live), timeout=deadline - time.monotonic()):
                live.pop(s).join()
        for p in live.values():
            p.kill()
            p.join()
        # every worker is gone: the pool's own thread sees it at once, fails what was in
        # flight and ends; joining it here (not at interpreter exit, where it raced the
        # closing of its wakeup pipe) leaves nothing of the pool behind
        self.shutdown(wait=True, cancel_futures=True)


def map_in_processes(
    fn: Callable[..., Any], items: Sequence[tuple], *, workers: int, names: Sequence[str]
) -> Iterator[Any]:
    """``fn(*item)`` for each item, in order: in this process for one item or one worker,
    else in up to ``workers`` processes. ``names[k]`` names item k in a timeout's message."""
    workers = min(workers, len(items))
    if workers <= 1:
        yield from (fn(*item) for item in items)
        return
    pool = WorkerPool(workers, None, _ignore_ctrl_c)
    finished = False
    try:
        futures = [pool.submit(fn, *item) for item in items]
        for name, future in zip(names, futures):
            try:
                yield future.result(timeout=LIST_TIMEOUT_S)
            except FuturesTimeout:
                raise PackError(
                    f"{name}: not listed in {LIST_TIMEOUT_S:g} s (a hung file system?)"
                ) from None
        finished = True
    finally:
        pool.stop(kill=not finished)
