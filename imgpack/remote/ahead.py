"""Fetch the blocks of the next batches while the current ones are read.

The loader knows a pass's order before it starts: ``Ahead`` walks it in a daemon thread,
a few batches ahead of the batches handed over (``done()``), and asks the pack's cache
for each batch's blocks with ``IN_FLIGHT`` requests under way at once. A batch the loop
reaches first is fetched by the read itself (the cache fetches each block once), so the
first batch waits for its own blocks only. The thread is stopped and joined at exit
(``imgpack.reader.run``) and when the pass ends; a fetch error here is left for the
read of that batch to raise.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Callable

import numpy as np

from imgpack.reader import run

__all__ = ["Ahead", "BATCHES_AHEAD", "IN_FLIGHT"]

BATCHES_AHEAD = 4  # batches fetched beyond the one handed over last
IN_FLIGHT = 4  # ranged requests under way at once
_WAKE_S = 0.05  # how often a prefetch that is far enough ahead looks at the loop again


class Ahead:
    """One pass's prefetch: ``fetch(block)`` for each of ``blocks(idx)`` of each batch of
    ``batches`` in turn, each block once."""

    def __init__(
        self, blocks: Callable[[np.ndarray], list], fetch: Callable[[Any], None],
        batches: Iterator[np.ndarray], done: Callable[[], int],
    ) -> None:  # fmt: skip
        self._blocks, self._fetch, self._batches, self._done = blocks, fetch, batches, done
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="imgpack-ahead", daemon=True)
        run.close_at_exit(self)
        self._thread.start()

    def _run(self) -> None:
        with ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="imgpack-fetch") as pool:
            under_way: set = set()
            seen: set = set()
            for k, idx in enumerate(self._batches):
                while k >= self._done() + BATCHES_AHEAD:
                    if self._stop.wait(_WAKE_S):
                        return
                for block in self._blocks(idx):
                    if self._stop.is_set():
                        return
                    if block not in seen:
                        seen.add(block)
                        try:
                            under_way.add(pool.submit(self._quiet, block))
                        except RuntimeError:  # the interpreter exits: no new fetches
                            return
                    if len(under_way) >= IN_FLIGHT:
                        under_way = wait(under_way, return_when="FIRST_COMPLETED").not_done

    def _quiet(self, block: Any) -> None:
        with contextlib.suppress(Exception):  # the read of this batch raises it, in one line
            if not self._stop.is_set():
                self._fetch(block)

    def close(self) -> None:
        """Stop walking; fetches under way finish (each is bounded), then the thread ends."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        run.forget_at_exit(self)
