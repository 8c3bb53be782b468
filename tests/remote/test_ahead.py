"""The prefetch of a remote pack's next blocks (imgpack.remote.mirror.Ahead)."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import numpy as np

from imgpack.remote.mirror import IN_FLIGHT, Ahead


def test_a_prefetch_closed_mid_pass_is_freed_at_once_without_the_garbage_collector():
    """What a prefetch refers to (the loader, whose persistent workers hold cache blocks
    that the next loader needs room for) goes when the pass is dropped, not at a later
    collection: a closed prefetch is in no reference cycle."""
    entered, closing = threading.Semaphore(0), threading.Event()

    def fetch(block):
        entered.release()
        closing.wait(10)
        time.sleep(0.1)  # close() has set its stop by now: no thread takes another block

    batches = iter([np.arange(k, k + 8) for k in range(0, 800, 8)])
    gc.disable()
    try:
        ahead = Ahead(lambda idx: idx.tolist(), fetch, batches, lambda: 0)
        for _ in range(IN_FLIGHT):  # every thread holds a block: the walk is mid-batch
            assert entered.acquire(timeout=10)
        closing.set()
        ahead.close()
        gone = weakref.ref(ahead)
        del ahead
        assert gone() is None
    finally:
        gc.enable()
