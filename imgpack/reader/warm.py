"""Warm a pack's page cache in the background, once per node, without delaying a batch.

Reading a cold pack record by record costs one random read per record; reading it whole,
front to back, fills the page cache at the disk's sequential speed. That pays for packs
that fit in RAM, but it must not hold up training: a 190 GB pack would take minutes, and
a warm read queued in front of a batch's reads delays that batch. So a thread does it in
small chunks, and before each chunk it waits while any loader of this process is waiting
for a batch (``run.DEMAND``): the first batch, and every batch the loop asks for and has not
got, costs its own reads only. Only one process per node warms at all: the first to take
an advisory lock (``flock``) on a small file in the temp dir, named by the pack's device,
inode, size and mtime and by the boot. The others read what they need as usual; the page
cache is shared. When the warm is complete the file says ``done`` and later processes on
this node (same boot) skip it, unless the kernel has evicted the pack since. A pack
already in the page cache (``in_page_cache``) needs no warm at all.

The warming process maps its chunks into its own page tables as it goes (the caller's
``populate``), so an in-process loader, the usual case, also takes no page faults later.
The thread, a daemon, is stopped and joined at exit (``imgpack.reader.run``).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import weakref
from typing import Callable

from imgpack.reader.run import DEMAND, close_at_exit, forget_at_exit

try:
    import fcntl
except ImportError:  # no flock (Windows): no warming
    fcntl = None  # type: ignore[assignment]

__all__ = ["Warmer", "CHUNK_BYTES", "lock_path", "in_page_cache"]

# One populate call: long enough to stream (readahead works in far smaller units), short
# enough that a batch asked for meanwhile waits for at most one chunk, and close() is quick.
CHUNK_BYTES = 4 << 20
_SAMPLES = 64  # pages probed by in_page_cache
_LIVENESS_S = 2.0  # a paused warm re-checks its stop flag at least this often
_DONE = b"done\n"
_live: weakref.WeakSet = weakref.WeakSet()  # warmers holding a lock in this process


def _forget_in_child() -> None:
    """A forked child has no warm thread: close its inherited copy of the lock, or it
    would hold the lock for as long as the child lives."""
    for w in list(_live):
        if w._fd is not None:
            os.close(w._fd)
            w._fd, w.state = None, "skipped"


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def in_page_cache(data_path: str | os.PathLike, offset: int, length: int) -> bool:
    """Whether ``[offset, offset+length)`` of the file looks wholly cached: a byte of each of
    ``_SAMPLES`` pages spread over it reads without I/O (``RWF_NOWAIT``). False where the
    platform cannot tell; a probe reads nothing from disk and changes nothing."""
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None or length <= 0:
        return False
    buf = bytearray(1)
    try:
        fd = os.open(data_path, os.O_RDONLY)
    except OSError:
        return False
    try:
        for k in range(_SAMPLES):
            os.preadv(fd, [buf], offset + (length - 1) * k // (_SAMPLES - 1), flag)
    except OSError:  # BlockingIOError: not cached; EOPNOTSUPP: cannot tell
        return False
    finally:
        os.close(fd)
    return True


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return "unknown-boot"


def lock_path(data_path: str | os.PathLike, offset: int, length: int) -> str:
    """The node-local lock file that says who warms this pack, and whether it is done."""
    st = os.stat(data_path)
    key = f"{_boot_id()}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{offset}:{length}"
    name = hashlib.sha1(key.encode()).hexdigest()[:20]
    return os.path.join(tempfile.gettempdir(), f"imgpack-warm-{name}.lock")


class Warmer:
    """One process's attempt to warm ``[offset, offset+length)`` with ``populate`` in chunks.

    ``state`` is "idle", "warming", "done" (by this process), "skipped" (another process
    on this node warms or warmed it, or no flock here), or "stopped" (``close()`` came first).
    """

    def __init__(
        self,
        data_path: str | os.PathLike,
        offset: int,
        length: int,
        populate: Callable[[int, int], object],
    ) -> None:
        self.data_path, self.offset, self.length = data_path, offset, length
        self.populate = populate
        self.state = "idle"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fd: int | None = None

    def start(self) -> str:
        """Take the node's lock and start the thread, or skip; returns the new state."""
        fd = self._lock()
        if fd is None:
            self.state = "skipped"
            return self.state
        self._fd, self.state = fd, "warming"
        _live.add(self)
        self._thread = threading.Thread(target=self._run, name="imgpack-warm", daemon=True)
        close_at_exit(self)
        self._thread.start()
        return "warming"  # not self.state: a short warm may be over already

    def _lock(self) -> int | None:
        if fcntl is None or self.length <= 0:
            return None
        try:
            fd = os.open(
                lock_path(self.data_path, self.offset, self.length), os.O_RDWR | os.O_CREAT, 0o666
            )
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.pread(fd, len(_DONE), 0) == _DONE:
                if in_page_cache(self.data_path, self.offset, self.length):
                    raise BlockingIOError  # warmed already on this boot, and still cached
                os.ftruncate(fd, 0)  # warmed once, evicted since: warm it again
        except OSError:
            os.close(fd)
            return None
        return fd

    def _run(self) -> None:
        end, pos = self.offset + self.length, self.offset
        try:
            while pos < end and not self._stop.is_set():
                DEMAND.wait_idle(self._stop)  # a batch someone waits for goes first
                if self._stop.is_set():
                    break
                n = min(CHUNK_BYTES, end - pos)
                self.populate(pos, n)
                pos += n
            if pos >= end:
                os.pwrite(self._fd, _DONE, 0)
                self.state = "done"
            else:
                self.state = "stopped"
        except (OSError, ValueError):  # the file went away or was unmapped: just stop
            self.state = "stopped"
        finally:
            fd, self._fd = self._fd, None
            if fd is not None:
                os.close(fd)  # releases the lock

    def done(self) -> bool:
        """Whether the pack is known warm on this node: by this process, or by another one
        (its lock file says so). Once True it stays True; until then each call reads a file."""
        if self.state == "done":
            return True
        if self.state != "skipped" or fcntl is None:
            return False
        try:
            fd = os.open(lock_path(self.data_path, self.offset, self.length), os.O_RDONLY)
        except OSError:
            return False
        try:
            if os.pread(fd, len(_DONE), 0) == _DONE:
                self.state = "done"
        finally:
            os.close(fd)
        return self.state == "done"

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; True when it has (or never ran)."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread after its chunk and wait for it (before unmapping, and at exit)."""
        self._stop.set()
        DEMAND.wake()
        forget_at_exit(self)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
