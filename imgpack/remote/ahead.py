"""Fetch the blocks of the next batches while the current ones are read.

The loader knows a pass's order before it starts: ``Ahead`` walks it a few batches ahead
of the batches handed over (``done()``), and ``IN_FLIGHT`` daemon threads take the walk's
blocks in turn and ask the pack's cache for each, so that as many requests are under way
at once. A batch the loop reaches first is fetched by the read itself (the cache fetches
each block once), so the first batch waits for its own blocks only. The threads are
stopped and joined at exit (``imgpack.reader.run``) and when the pass ends; a fetch error
here is left for the read of that batch to raise.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np

from imgpack.reader import run

__all__ = ["Ahead", "BATCHES_AHEAD", "IN_FLIGHT"]

BATCHES_AHEAD = 4  # batches fetched beyond the one handed over last
IN_FLIGHT = 4  # ranged requests under way at once
_WAKE_S = 0.05  # how often a prefetch that is far enough ahead looks at the loop again


class Ahead:
    """One pass's prefetch: ``fetch(block)`` for each of ``blocks(idx)`` of each batch of
    ``batches`` in turn, each block once, by ``IN_FLIGHT`` threads that take the next block
    of one walk over the pass in turn."""

    def __init__(
        self, blocks: Callable[[np.ndarray], list], fetch: Callable[[Any], None],
        batches: Iterator[np.ndarray], done: Callable[[], int],
    ) -> None:  # fmt: skip
        self._fetch, self._stop, self._turn = fetch, threading.Event(), threading.Lock()
        self._walk = _walk(blocks, batches, done, self._stop)
        self._threads = [
            threading.Thread(target=self._run, name="imgpack-ahead", daemon=True)
            for _ in range(IN_FLIGHT)
        ]
        run.close_at_exit(self)
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._turn:  # a generator runs in one thread at a time
                block = next(self._walk, None)
            if block is None:
                return
            with contextlib.suppress(Exception):  # the read of this batch raises it, in one line
                self._fetch(block)

    def close(self) -> None:
        """Stop walking; fetches under way finish (each is bounded), then the threads end."""
        self._stop.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
        run.forget_at_exit(self)


def _walk(
    blocks: Callable[[np.ndarray], list], batches: Iterator[np.ndarray],
    done: Callable[[], int], stop: threading.Event,
) -> Iterator[Any]:  # fmt: skip
    """The pass's blocks, each once, no more than ``BATCHES_AHEAD`` batches ahead of the
    loop; it ends when the pass or the prefetch does. A function, not a method: a walk
    left mid-pass must not hold its ``Ahead``, or the two would make a cycle that keeps
    the loader (and its workers' cache blocks) alive until a garbage collection."""
    seen: set = set()
    for k, idx in enumerate(batches):
        while k >= done() + BATCHES_AHEAD:
            if stop.wait(_WAKE_S):
                return
        for block in blocks(idx):
            if block not in seen:
                seen.add(block)
                yield block
