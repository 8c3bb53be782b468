"""imgpack's background threads end before the interpreter does.

A daemon thread still inside torch or numpy while Python finalises aborts the whole
process (``terminate called without an active exception``, status 134): a training script
that returns while it still holds a loader iterator would look failed to its scheduler.
So imgpack's threads are ordinary (non-daemon) threads, and whoever starts one registers
its ``close()`` here. One hook, registered with ``threading._register_atexit`` as
``concurrent.futures`` does, closes them when the main thread is done, before the
interpreter joins the remaining threads and long before it tears anything down; a loader
that feeds another live non-daemon thread is left to it (the interpreter waits for that
thread, and the loader ends with its pass).
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol

__all__ = ["Closeable", "watch", "unwatch", "close_all"]


class Closeable(Protocol):
    def close(self) -> None:
        """Stop the owner's threads and join them."""


# The owners with a thread that may be running, each with the thread it serves (None: the
# process). Weak: a thread's target keeps its owner alive while it runs, and an owner that
# is gone has no thread left to stop.
_owners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def watch(owner: Closeable, serves: threading.Thread | None = None) -> None:
    """Close ``owner`` when the main thread is done, unless it was closed before, or unless
    ``serves`` (the thread reading its batches) is another non-daemon thread still running:
    the interpreter waits for that thread, so its loader must keep working until it ends."""
    with _lock:
        _owners[owner] = serves


def unwatch(owner: Closeable) -> None:
    with _lock:
        _owners.pop(owner, None)


def _still_served(thread: threading.Thread | None) -> bool:
    return (
        thread is not None
        and thread is not threading.current_thread()
        and not thread.daemon
        and thread.is_alive()
    )


def close_all() -> None:
    """Close every watched owner not serving a live thread (the exit hook; tests call it)."""
    with _lock:
        owners = [o for o, serves in _owners.items() if not _still_served(serves)]
    for owner in owners:
        owner.close()


# Runs when the main thread is done, before the interpreter joins non-daemon threads
# (a plain ``atexit`` hook would run only after those joins, which would then wait forever).
threading._register_atexit(close_all)
