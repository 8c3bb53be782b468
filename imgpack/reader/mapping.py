"""One pack's memory mapping, opened lazily once per process, and the madvise helpers around it.

Why a private copy-on-write mapping (``ACCESS_COPY``, i.e. ``MAP_PRIVATE`` with
read+write protection): numpy views of it are writable, so ``torch.from_numpy``
gives tensors without torch's "non-writable array" warning, and a caller who
writes into a sample tensor only ever dirties a private copy of that page in
its own process; the file is never written. Reads share the page cache like a
read-only mapping does. Two consequences we handle on purpose:

* ``MAP_POPULATE`` must not be used: the kernel populates a writable private
  mapping with write faults, copying the whole pack into anonymous memory.
  Prefaulting uses ``MADV_POPULATE_READ`` (Linux 5.14+) or, failing that, a
  read of one byte per page.
* Under strict overcommit (``vm.overcommit_memory=2``) the kernel charges the
  whole private mapping as commit; if that mmap fails we fall back to a
  read-only shared mapping, and sample views are copied instead of shared.

``PackMapping`` holds one pack; a dataset holds one per pack.

**Residency.** What the kernel is told about the pages (``advice``, ``will_need``), and
warming the page cache in the background, once per node, without delaying a batch
(``PackMapping.start_warm``): reading a cold pack record by record costs one random read per
record; reading it whole, front to back, fills the page cache at the disk's sequential
speed. That pays for packs that fit in RAM, but it must not hold up training: a 190 GB pack
would take minutes, and a warm read queued in front of a batch's reads delays that batch. So
a thread does it in small chunks, and before each chunk it waits while any loader of this
process is waiting for a batch (``run.DEMAND``): the first batch, and every batch the loop
asks for and has not got, costs its own reads only. Only one process per node warms at all:
the first to take an advisory lock (``flock``) on a small file in the temp dir, named by the
pack's device, inode, size and mtime and by the boot. The others read what they need as
usual; the page cache is shared. When the warm is complete the file says ``done`` and later
processes on this node (same boot) skip it, unless the kernel has evicted the pack since. A
pack already in the page cache (``in_page_cache``) needs no warm at all.

The warming process maps its chunks into its own page tables as it goes (``prefault``), so
an in-process loader, the usual case, also takes no page faults later. The thread, a daemon,
is stopped and joined at exit (``imgpack.reader.run``).
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import sys
import tempfile
import threading
from typing import Any

import numpy as np

from imgpack.errors import FormatError, InvalidArgumentError
from imgpack.format.index import PackIndex
from imgpack.format.layout import HEADER_BYTES
from imgpack.machine import mem_available
from imgpack.reader.order import check_flag
from imgpack.reader.run import DEMAND, close_at_exit, forget_at_exit

try:
    import fcntl
except ImportError:  # no flock (Windows): no warming
    fcntl = None  # type: ignore[assignment]

__all__ = ["PackMapping", "madvise", "prefault", "page_ranges", "auto_prefault"]

# advice name -> its mmap constant; None where this platform has none (then skipped)
ADVICE = {k: getattr(mmap, f"MADV_{k.upper()}", None) for k in ("normal", "random", "sequential")}

# Linux's MADV_POPULATE_READ (5.14+), 22 on every architecture; Python's mmap module does not
# export it before 3.13ish, and madvise() passes any integer through to the kernel, which
# answers EINVAL when too old.
_MADV_POPULATE_READ = 22 if sys.platform.startswith("linux") else None
_PAGE = mmap.PAGESIZE
_AUTO_PREFAULT_SHARE = 0.5  # prefault only packs smaller than this share of MemAvailable
# One populate call: long enough to stream (readahead works in far smaller units), short
# enough that a batch asked for meanwhile waits for at most one chunk, and close() is quick.
CHUNK_BYTES = 4 << 20
_SAMPLES = 64  # pages probed by in_page_cache
_DONE = b"done\n"
_BOOT_ID = "/proc/sys/kernel/random/boot_id"  # names this boot: a warm's record lasts one
_live: dict[int, PackMapping] = {}  # a warm's lock (its fd) -> its mapping, in this process

# Guards the first mapping in each process; re-created in a forked child, where a lock held
# by another thread at fork time would stay held forever.
_open_lock = threading.Lock()


def _in_child() -> None:
    """A forked child has a new open lock, and no warm thread: it closes its inherited copy
    of a warm's lock, or it would hold that lock for as long as it lives."""
    global _open_lock
    _open_lock = threading.Lock()
    for fd, w in _live.items():
        os.close(fd)
        w.warm_state = "skipped"
    _live.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)


# The sections a mapped pack gives zero-copy numpy views of (``PackIndex.section_array``),
# read-only on the read-only fallback mapping; nothing here is per-sample. "pixels": (N, H,
# W, C) uint8 for a uniform pack, else the flat bytes; "labels": (N,) <i4; "path_offsets":
# (N + 1,) <u8; "paths": the paths' bytes, uint8.
_VIEWS = ("pixels", "labels", "path_offsets", "paths")


def madvise(mm: mmap.mmap, option: int | None, start: int, length: int) -> bool:
    """``mm.madvise(option)`` over ``[start, start + length)`` widened to whole pages (an end
    past the mapping's is the mapping's); False where unsupported (``option`` None: an advice
    this platform lacks)."""
    if option is None or not hasattr(mm, "madvise"):
        return False
    try:  # a start past the mapping's end (or a closed mapping): ValueError
        mm.madvise(option, start - start % _PAGE, length + start % _PAGE)
    except (OSError, ValueError):
        return False
    return True


def prefault(mm: mmap.mmap, start: int, length: int) -> str:
    """Map the pages of ``[start, start+length)`` now instead of on first touch; return how."""
    if madvise(mm, _MADV_POPULATE_READ, start, length):  # (None: no such advice here)
        return "populate_read"
    # A read of one byte per page: read faults map page-cache pages without copying them.
    view = np.frombuffer(mm, dtype=np.uint8, count=length, offset=start)
    np.bitwise_or.reduce(view[::_PAGE])
    return "touch"


def page_ranges(idx: np.ndarray, base: int, offsets: np.ndarray) -> list[tuple[int, int]]:
    """Page-aligned (start, length) byte ranges covering records ``idx``; adjacent runs merged.

    Record i lies from ``base + offsets[i]`` to ``base + offsets[i + 1]`` (a pack's
    ``record_offsets``, whatever its layout).
    """
    if len(idx) == 0:
        return []
    rec = np.sort(idx)  # a record given twice lies within its own range: merged below
    starts, ends = base + offsets[rec], base + offsets[rec + 1]
    starts -= starts % _PAGE
    # a new range begins where the previous record's end does not reach this start; each
    # runs from its first record's start to its last record's end
    breaks = np.flatnonzero(starts[1:] > ends[:-1]) + 1
    lo, hi = starts[np.append(0, breaks)], ends[np.append(breaks, len(rec)) - 1]
    return [(int(s), int(e - s)) for s, e in zip(lo, hi)]


def auto_prefault(nbytes: int) -> bool:
    """Prefault only when the pixels fit comfortably in available RAM, known on Linux only
    (``mem_available`` is None elsewhere)."""
    avail = mem_available()
    return avail is not None and nbytes < _AUTO_PREFAULT_SHARE * avail


def in_page_cache(data_path: str | os.PathLike, offset: int, length: int) -> bool:
    """Whether ``[offset, offset+length)`` of the file looks wholly cached: a byte of each of
    ``_SAMPLES`` pages spread over it reads without I/O (``RWF_NOWAIT``). False where the
    platform cannot tell; a probe reads nothing from disk and changes nothing."""
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None or length <= 0:
        return False
    try:
        with open(data_path, "rb", buffering=0) as f:
            for k in range(_SAMPLES):  # one byte of each probed page
                at = offset + (length - 1) * k // (_SAMPLES - 1)
                os.preadv(f.fileno(), [bytearray(1)], at, flag)
    except OSError:  # BlockingIOError: not cached; EOPNOTSUPP: cannot tell; or no file
        return False
    return True


def lock_path(data_path: str | os.PathLike, offset: int, length: int) -> str:
    """The node-local lock file that says who warms this pack, and whether it is done."""
    boot = "unknown-boot"
    with contextlib.suppress(OSError), open(_BOOT_ID, encoding="ascii") as f:
        boot = f.read().strip()
    st = os.stat(data_path)
    key = f"{boot}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{offset}:{length}"
    name = hashlib.sha1(key.encode()).hexdigest()[:20]
    return os.path.join(tempfile.gettempdir(), f"imgpack-warm-{name}.lock")


class PackMapping:
    """A pack's index plus its mapping, opened on first use in each process.

    ``auto``: what ``prefault=None`` means, decided by the dataset for all its packs at once
    (``auto_prefault``); with None a pack found wholly in the page cache is not warmed.
    Pickles as (index, advice, prefault, auto) only. After fork the inherited mapping
    is reused (never re-created per item); page tables are not inherited, so a
    requested prefault runs again once in the new process.

    **The warm** (module docstring): ``warm_state`` is "idle", "warming", "done" (by this
    process, or found in the page cache with ``prefault=None``), "skipped" (another process
    on this node warms or warmed it, or no flock here) or "stopped" (``close()`` came first).
    """

    def __init__(
        self,
        index: PackIndex,
        *,
        advice: str | None = None,
        prefault: bool | None = None,
        auto: bool = False,
    ):
        if advice is not None and advice not in ADVICE:
            raise InvalidArgumentError(
                f"advice {advice!r} is not one of {', '.join(map(repr, ADVICE))} or None"
            )
        self.index, self.advice, self.auto = index, advice, auto
        self.prefault = check_flag("prefault", prefault, none_ok=True)
        self._mm = self._views = None  # the mapping and its views (``_VIEWS``): not yet made
        self._pid = -1  # the process whose page tables were set up
        self.warm_state, self._warm_thread = "idle", None  # (and _warm_stop: start_warm's)
        pixels = self.index.sections["pixels"]
        self._pixels = (pixels.offset, pixels.nbytes)  # (offset, length): what a warm reads

    def __getstate__(self) -> dict[str, Any]:
        return {k: self.__dict__[k] for k in ("index", "advice", "prefault", "auto")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # as made: mapped again, lazily, where it is unpickled

    @property
    def warm(self) -> bool:
        """Whether the whole pack is known to be in the page cache: found there, or warmed on
        this node (by this process, or by another one: its lock file says so). Once True it
        stays True; until then each call may read a file."""
        if self.warm_state == "skipped" and fcntl is not None:
            path = lock_path(self.index.data_path, *self._pixels)
            with contextlib.suppress(OSError), open(path, "rb") as f:
                if f.read(len(_DONE)) == _DONE:
                    self.warm_state = "done"
        return self.warm_state == "done"

    @property
    def views(self) -> dict[str, np.ndarray]:
        """The zero-copy views (``_VIEWS``), mapping the file on first use in this process
        (where the warm, if any, starts)."""
        views = self._views  # read before the pid: close() clears the pid first
        if self._pid == os.getpid() and views is not None:
            return views
        with _open_lock:
            if self._pid == os.getpid() and self._views is not None:
                return self._views
            if self._views is None:
                self._views = self._open()
            else:  # inherited through fork: the file may have been rewritten in place since
                self.index.check_header(self._mm[:HEADER_BYTES], len(self._mm))
            # prefault=None: a pack already in the page cache needs no warm (nor read hints)
            cached = self.prefault is None and in_page_cache(self.index.data_path, *self._pixels)
            self.warm_state, self._warm_thread = ("done" if cached else "idle"), None
            # once per node; prefault=None: as decided for the dataset
            if (self.auto if self.prefault is None else self.prefault) and not cached:
                self.start_warm()
            self._pid = os.getpid()
            return self._views

    def start_warm(self) -> str:
        """Take the node's lock and start the warm's thread, or skip; the new state."""
        fd = self._lock()
        if fd is None:
            self.warm_state = "skipped"
            return self.warm_state
        self.warm_state, self._warm_stop, _live[fd] = "warming", threading.Event(), self
        thread = threading.Thread(target=self._warm, args=(fd,), name="imgpack-warm", daemon=True)
        self._warm_thread = thread
        close_at_exit(self, "stop_warm")
        thread.start()
        return "warming"  # not warm_state: a short warm may be over already

    def _lock(self) -> int | None:
        """The node's lock of this pack's warm, taken, or None (taken by another process, or
        warmed already on this boot and still cached)."""
        if fcntl is None:
            return None
        fd = None
        try:
            path = lock_path(self.index.data_path, *self._pixels)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.pread(fd, len(_DONE), 0) == _DONE:
                if in_page_cache(self.index.data_path, *self._pixels):
                    raise BlockingIOError  # warmed already on this boot, and still cached
                os.ftruncate(fd, 0)  # warmed once, evicted since: warm it again
        except OSError:
            if fd is not None:
                os.close(fd)
            return None
        return fd

    def _warm(self, fd: int) -> None:
        """The warm's thread, holding the node's lock ``fd``: the pixels in chunks, each after
        any batch waited for. What it holds is its own (a warm that outlived ``stop_warm``'s
        wait touches no later one's, and a mapping closed under it stops it: ValueError)."""
        (start, length), stop, mm = self._pixels, self._warm_stop, self._mm
        end = start + length
        try:
            for pos in range(start, end, CHUNK_BYTES):
                DEMAND.wait_idle(stop)  # a batch someone waits for goes first
                if stop.is_set():
                    break
                prefault(mm, pos, min(CHUNK_BYTES, end - pos))
            else:  # every chunk read: the node's lock file says so
                os.pwrite(fd, _DONE, 0)
        except (OSError, ValueError):  # the file went away or was unmapped: just stop
            stop.set()
        finally:
            self.warm_state = "stopped" if stop.is_set() else "done"
            _live.pop(fd, None)
            os.close(fd)  # releases the lock

    def stop_warm(self, timeout: float = 10.0) -> None:
        """Stop the warm after its chunk and wait for it (before unmapping, and at exit)."""
        self._warm_stop.set()
        DEMAND.add(0)  # a paused warm wakes to see the stop
        forget_at_exit(self)
        thread = self._warm_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _open(self) -> dict[str, np.ndarray]:
        ix = self.index
        with open(ix.data_path, "rb") as f:
            # the pack this process maps must be the one whose index it holds (PackChangedError)
            ix.check_same_pack(f)
            try:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            except OSError:  # strict overcommit refuses a large private writable mapping:
                # views of this one are read-only (their ``flags.writeable`` says so)
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._mm = mm
        madvise(mm, ADVICE.get(self.advice), *self._pixels)  # (no advice: None, skipped)
        views = {k: ix.section_array(k, mm) for k in _VIEWS}
        if ix.uniform:  # a batch of records is one np.take
            views["pixels"] = views["pixels"].reshape(ix.count, *ix.shape)
        return views

    def will_need(self, idx: np.ndarray) -> None:
        """MADV_WILLNEED on the pages of records ``idx`` (already bounds-checked); nothing
        where the platform has no such advice (``madvise``)."""
        self.views  # noqa: B018 - maps the file in this process if needed
        for start, length in page_ranges(idx, self.index.data_offset, self.index.record_offsets):
            madvise(self._mm, getattr(mmap, "MADV_WILLNEED", None), start, length)

    def stored(self, k: int, stop: int | None = None) -> np.ndarray:
        """The stored bytes of record ``k`` (of records ``k``..``stop - 1``, end to end),
        already bounds-checked: a flat view of the mapping."""
        offsets = self.index.record_offsets
        a, b = int(offsets[k]), int(offsets[k + 1 if stop is None else stop])
        return self.views["pixels"].reshape(-1)[a:b]

    def source_path(self, k: int) -> str:
        """Record ``k``'s (already bounds-checked) source path, from the two path sections."""
        v, name = self.views, self.index.json_path.name
        offsets, paths = v["path_offsets"], v["paths"]
        a, b = int(offsets[k]), int(offsets[k + 1])
        if not 0 <= a <= b <= len(paths):
            raise FormatError(
                f"{name}: record {k} path runs {a}..{b}, the paths section has {len(paths)} bytes"
            )
        try:
            return self.index.source_path(k, offsets, paths)
        except UnicodeDecodeError as e:
            raise FormatError(f"{name}: record {k} path is not UTF-8 ({e.reason})") from None

    def close(self) -> None:
        """Drop the views and unmap; a mapping still used by live tensors is left to the GC."""
        if self._warm_thread is not None and self._pid == os.getpid():
            self.stop_warm()  # it populates through the mapping about to go
        with _open_lock:  # a loader thread mapping the pack again meanwhile waits for this
            self._pid = -1  # first: a concurrent read then maps again instead of seeing None
            mm, self._mm, self._views = self._mm, None, None
        if mm is not None:  # someone may still hold a sample view: it keeps the pages alive
            with contextlib.suppress(BufferError):
                mm.close()
