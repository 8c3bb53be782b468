"""imgpack's background threads end before the interpreter does.

A daemon thread still inside torch or numpy while Python finalises aborts the whole
process (``terminate called without an active exception``, status 134): a training script
that returns while it still holds a loader iterator would look failed to its scheduler.
So imgpack's threads are ordinary (non-daemon) threads, and whoever starts one registers
its ``close()`` here. One hook, registered with ``threading._register_atexit`` as
``concurrent.futures`` does, closes them all when the main thread is done, before the
interpreter joins the remaining threads and long before it tears anything down.
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol

__all__ = ["Closeable", "watch", "unwatch", "close_all"]


class Closeable(Protocol):
    def close(self) -> None:
        """Stop the owner's threads and join them."""


# The owners with a thread that may be running. Weak: a thread's target keeps its owner
# alive while it runs, and an owner that is gone has no thread left to stop.
_owners: weakref.WeakSet = weakref.WeakSet()
_lock = threading.Lock()


def watch(owner: Closeable) -> None:
    """Close ``owner`` at interpreter exit unless it was closed before."""
    with _lock:
        _owners.add(owner)


def unwatch(owner: Closeable) -> None:
    with _lock:
        _owners.discard(owner)


def close_all() -> None:
    """Close every watched owner (the exit hook; also usable by tests)."""
    with _lock:
        owners = list(_owners)
    for owner in owners:
        owner.close()


# Runs when the main thread is done, before the interpreter joins non-daemon threads
# (a plain ``atexit`` hook would run only after those joins, which would then wait forever).
threading._register_atexit(close_all)
