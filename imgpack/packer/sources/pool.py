"""Listing many source files on every core: one call per file, results in the files' order.

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
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any

from imgpack.errors import PackError

__all__ = ["LIST_TIMEOUT_S", "map_in_processes"]

LIST_TIMEOUT_S = 600.0  # longest wait for one file's listing: only a hung file system hits it


def _ignore_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def map_in_processes(
    fn: Callable[..., Any], items: Sequence[tuple], *, workers: int, names: Sequence[str]
) -> Iterator[Any]:
    """``fn(*item)`` for each item, in order: in this process for one item or one worker,
    else in up to ``workers`` processes. ``names[k]`` names item k in a timeout's message."""
    workers = min(workers, len(items))
    if workers <= 1:
        yield from (fn(*item) for item in items)
        return
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    pool = ProcessPoolExecutor(workers, mp.get_context(method), initializer=_ignore_ctrl_c)
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
        procs = list((getattr(pool, "_processes", None) or {}).values())
        manager = getattr(pool, "_executor_manager_thread", None)
        pool.shutdown(wait=finished, cancel_futures=True)
        for p in procs if not finished else ():
            p.terminate()
        for p in procs:
            p.join(timeout=10)
        if manager is not None:  # joined here, not at interpreter exit (parallel.close)
            manager.join(timeout=10)
