"""A remote pack's local cache: one sparse file, filled block by block, shared by processes.

The cache file is the pack itself at its full size, the file the dataset maps: its header
and metadata sections are fetched at open, its records in blocks (runs of whole records
of about ``BLOCK_BYTES``) when first needed, each with one ranged read, checked against
the records' CRC-32s and its length, written in place, made durable, and only then marked
present. So a record is read from the same mapping as a local pack's (a view, a batch
one gather), and nothing half written or damaged is ever marked present.

Every pack folder ``<cache_dir>/<key>/`` (``key``: the URL, size, ETag or mtime and index
digest, so a changed object is a new folder, never an old copy) holds the pack's
``.json`` and ``.bin``, ``bounds`` (where each block starts: record, byte) and ``blocks``
(int64 per block: 0 absent, -1 being fetched, else when it was last taken), which every
process maps shared. Processes agree through two kinds of lock: ``<cache_dir>/lock``
(``flock``), held only while one changes what is present, and byte-range locks
(``lockf``) on the folder's ``pins`` file: byte b is read-locked by every process holding
block b (its reads may be under way) and write-locked by the one fetching or evicting it.
So a block is fetched once (the others poll its lock, which its fetcher's death also
frees), and eviction, which punches the block out of the file (``fallocate``) so that the
folder's allocated bytes stay under ``cache_limit``, takes only blocks no process holds,
least recently taken first. Each process holds the blocks of its reads under way; without
a limit it keeps every block it has read (a sample is a view of the mapping), under one
only its last (a sample is a copy, ``mirror.RemotePacks.own``), so that the holds of
several workers never fill it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import threading
import time
import zlib
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.errors import InvalidArgumentError, PackChangedError
from imgpack.format.index import PackIndex
from imgpack.reader.order import DEFAULT_BLOCK_BYTES
from imgpack.remote import RemoteError
from imgpack.remote.store import Store

__all__ = ["BlockCache", "BLOCK_BYTES", "folder_lock", "allocated", "parse_limit", "lay_out"]

BLOCK_BYTES = DEFAULT_BLOCK_BYTES  # one request, the block order's block: streams, starts fast
MIN_BLOCK_BYTES = 16 << 10  # a small limit's blocks (``limit / 64``) are no smaller
_WAIT_S = 600.0  # a read waiting on another thread's fetch of its block (itself bounded)
_PUNCH = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update(KIB=1 << 10, MIB=1 << 20, GIB=1 << 30, TIB=1 << 40)
_SIZE = re.compile(r"(\d+\.?\d*|\.\d+)(|B|[KMGT]I?B)")  # a number, then one of _UNITS
# the C library already loaded: ``ctypes.util.find_library`` runs ldconfig, and a worker
# forked during that run kept its pipe open, so the parent waited under the folder lock
_LIBC = ctypes.CDLL(None, use_errno=True)


def parse_limit(value: Any) -> int | None:
    """``cache_limit``: None, bytes, or a string such as "50GB" or "512MiB"."""
    if value is None or type(value) is int and value > 0:
        return value  # an int exactly, however large
    size = _SIZE.fullmatch(str(value).strip().upper().replace(" ", ""))  # not True, -1, "inf"
    n = float(size[1]) * _UNITS[size[2]] if size else 0
    if not 1 <= n < float("inf") or isinstance(value, float) and not value.is_integer():
        raise InvalidArgumentError(
            f"cache_limit {value!r} is not a size: give bytes (an int) or a string like '50GB'"
        )
    return int(n)


@contextlib.contextmanager
def folder_lock(cache_dir: Path):
    """The cache folder's exclusive lock: ``flock`` on a descriptor opened for this one
    acquisition, so each holder, thread or process, is its own owner and the threads of
    a process exclude each other. Not a record lock (``lockf``): those are owned by the
    process, so the kernel took a process's prefetch thread waiting here while its other
    thread held a block a forked worker waited on for a cycle and refused the wait
    (EDEADLK), a false deadlock. Unlocked explicitly before the close: a child forked
    while a thread holds it shares the descriptor, and must not keep it held."""
    fd = os.open(cache_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)  # nothing where it was not taken
        os.close(fd)


def allocated(cache_dir: Path) -> int:
    """Bytes the cache folder's files take on disk (sparse holes take none)."""
    folders = [e.path for e in os.scandir(cache_dir) if e.is_dir(follow_symlinks=False)]
    return sum(f.stat().st_blocks * 512 for folder in folders for f in os.scandir(folder))


def lay_out(folder: Path, index: PackIndex, limit: int | None) -> None:
    """The block table of a new pack folder: blocks of whole records, as many as the block
    order's blocks hold (so the two coincide), none present yet."""
    mean = max(1, round(float(np.mean(index.record_lengths)))) if index.count else 1
    # a small limit's blocks are smaller, but no smaller than pages (the unit of disk space)
    block = max(MIN_BLOCK_BYTES, BLOCK_BYTES if limit is None else min(BLOCK_BYTES, limit // 64))
    records = np.append(np.arange(0, index.count, max(1, block // mean)), index.count)
    offsets = index.data_offset + index.record_offsets[records]
    np.stack((records, offsets), axis=1).astype("<i8").tofile(folder / "bounds")
    np.zeros(len(records) - 1, "<i8").tofile(folder / "blocks")  # (``pins``: made where used)


def _pin(fd: int, b: int, how: int) -> bool:
    """lockf byte ``b`` of a pins file; False where a non-blocking lock is refused. Only
    ever non-blocking: a blocking record lock is checked for cycles between processes,
    and with several threads per process those cycles are false (EDEADLK)."""
    try:
        fcntl.lockf(fd, how, 1, b)
    except OSError:
        return False
    return True


class _Folder:
    """One pack folder as this process has it: its files open, the blocks it holds (pinned
    here, oldest first), the reads under way per block (never unpinned), and a lock per
    block that its threads take in turn to take that block."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # (the block table's two columns: where each block starts, record and byte)
        self.first_record, self.first_byte = np.fromfile(path / "bounds", "<i8").reshape(-1, 2).T
        self.sizes = np.diff(self.first_byte)
        # the block table, a mapping shared with every process that maps it
        self.state = np.memmap(path / "blocks", "<i8", "r+") if len(self.sizes) else np.zeros(0)
        self.bin = os.open(next(path.glob("*.bin")), os.O_RDWR)
        self.pins = os.open(path / "pins", os.O_RDWR | os.O_CREAT, 0o644)  # never closed:
        # closing any descriptor of it would drop every lock this process holds on it
        self.held: OrderedDict[int, None] = OrderedDict()
        self.busy: Counter[int] = Counter()
        self.turns: dict[int, threading.Lock] = {}  # a block's fetch, one thread at a time
        self.failed: dict[int, BaseException] = {}  # its last fetch's error, for its waiters
        self.mutex = threading.Lock()

    def taken(self, b: int, read: bool) -> None:
        """Block ``b`` (present) read-locked and held here, marked as taken now; under the
        folder lock, so that no evictor of this process looks before it is held."""
        _pin(self.pins, b, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a fetcher's write lock -> read
        self.state[b] = time.time_ns()
        with self.mutex:
            self.held[b] = None
            self.busy[b] += read

    def release(self, b: int) -> None:
        """No longer held here; call under ``mutex``."""
        del self.held[b]
        _pin(self.pins, b, fcntl.LOCK_UN)

    def evict(self, b: int) -> int:
        """Punch block ``b`` out unless some process holds it; the bytes freed. Call under
        the folder lock."""
        if b in self.held or not _pin(self.pins, b, fcntl.LOCK_EX | fcntl.LOCK_NB):
            return 0
        try:  # a failed punch must not leave the block locked by this process
            self.state[b] = 0
            start, size = (ctypes.c_int64(int(x)) for x in (self.first_byte[b], self.sizes[b]))
            if _LIBC.fallocate(ctypes.c_int(self.bin), ctypes.c_int(_PUNCH), start, size):
                raise InvalidArgumentError(
                    f"{self.path.parent}: cannot free space in the cache "
                    f"({os.strerror(ctypes.get_errno())}); give a cache_dir on a local file "
                    "system (ext4, xfs, tmpfs)"
                )
            return size.value
        finally:
            _pin(self.pins, b, fcntl.LOCK_UN)


_FOLDERS: dict[str, _Folder] = {}  # this process's, by path
os.register_at_fork(after_in_child=_FOLDERS.clear)  # a child holds none of its parent's locks


def _folder(path: Path) -> _Folder:
    """This process's one view of ``path``. Two threads opening it at once both make one,
    and the first one stored is used by both (the other's files stay open: closing the
    pins file would drop this process's locks)."""
    found = _FOLDERS.get(str(path))
    return found if found is not None else _FOLDERS.setdefault(str(path), _Folder(path))


class BlockCache:
    """The blocks of one remote pack in its cache folder; pickles as its names only.

    ``crcs`` and ``offsets`` (start of every record and the end, in the .bin) are the
    pack index's (``RemotePacks.attach``); ``limit``: the folder's bound in bytes, or
    None; ``identity``: the object's (size, version) when opened."""

    def __init__(self, folder: Path, store: Store, limit: int | None, identity: tuple) -> None:
        self.folder, self.store, self.limit, self.identity = folder, store, limit, identity

    def __getstate__(self) -> dict[str, Any]:
        return {k: self.__dict__[k] for k in ("folder", "store", "limit", "identity")}

    @property
    def here(self) -> _Folder:
        """This process's view of the folder (a forked worker opens its own)."""
        return _folder(self.folder)

    def blocks_of(self, records: np.ndarray) -> list[int]:
        """The blocks holding ``records`` (in range), in order of first appearance."""
        blocks = np.searchsorted(self.here.first_record, records, side="right") - 1
        return list(dict.fromkeys(blocks.tolist()))

    @contextlib.contextmanager
    def reading(self, records: np.ndarray):
        """The blocks of ``records`` present and pinned while the block runs; afterwards
        under a limit the last one stays pinned (a sample's view may outlive its read)."""
        here, blocks = self.here, []
        try:
            for b in self.blocks_of(records):
                self.take(b)
                blocks.append(b)
            yield
        finally:
            with here.mutex:
                here.busy.subtract(blocks)
                if self.limit is not None:
                    for old in [b for b in here.held if here.busy[b] <= 0][:-1]:
                        here.release(old)

    def take(self, b: int, *, hold: bool = True) -> None:
        """Block ``b`` present (and, ``hold``, pinned here for a read, which ``reading``
        ends): found, waited for or fetched. One thread of this process at a time takes a
        block: the others wait for its turn, then find it held, or raise the error its fetch
        raised."""
        here = self.here
        with here.mutex:
            turn = here.turns.setdefault(b, threading.Lock())
        waited = not turn.acquire(blocking=False)
        if waited and not turn.acquire(timeout=_WAIT_S):
            raise RemoteError(f"{self.store.url}: block {b} waited {_WAIT_S:.0f} s for a fetch")
        try:
            with here.mutex:
                failed = here.failed.pop(b, None)  # the fetch of the turn before this one
                if b in here.held:
                    if hold:
                        here.held.move_to_end(b)
                        here.busy[b] += 1
                    return
            if waited and failed is not None:  # the fetch this thread waited for failed
                raise failed
            self._acquire(here, b, hold)
            with here.mutex:
                if not hold and here.busy[b] <= 0:  # fetched for later: held by no one here
                    here.release(b)
        finally:
            turn.release()

    def _acquire(self, here: _Folder, b: int, read: bool) -> None:
        """Block ``b`` present and held here: found, waited for or fetched."""
        while True:
            with folder_lock(self.folder.parent):
                if here.state[b] > 0:
                    return here.taken(b, read)
                # absent, or marked by a fetcher: alive while it holds the write lock
                mine = _pin(here.pins, b, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if mine:
                    self.make_room(int(here.sizes[b]))
                    here.state[b] = -1
            if mine:
                return self._fetch(here, b, read)
            while not _pin(here.pins, b, fcntl.LOCK_SH | fcntl.LOCK_NB):
                time.sleep(0.005)  # its fetcher's read is bounded; its death frees the lock
            _pin(here.pins, b, fcntl.LOCK_UN)  # then look again

    def _fetch(self, here: _Folder, b: int, read: bool) -> None:
        r0, r1 = here.first_record[b : b + 2].tolist()
        start, end = here.first_byte[b : b + 2].tolist()
        what = f"records {r0}..{r1 - 1}"
        try:
            try:
                data = self.store.read(start, end, what, lambda d: self._damage(r0, r1, d))
            except RemoteError:
                if self.store.identity() != tuple(self.identity):
                    raise PackChangedError(
                        f"{self.store.url}: the object changed since the dataset opened it "
                        f"(reading {what}); reopen the dataset"
                    ) from None
                raise
            os.pwrite(here.bin, data, start)
            os.fdatasync(here.bin)
        except BaseException as e:
            here.failed[b] = e
            with folder_lock(self.folder.parent):
                here.state[b] = 0
                _pin(here.pins, b, fcntl.LOCK_UN)
            raise
        with folder_lock(self.folder.parent):
            here.taken(b, read)

    def _damage(self, r0: int, r1: int, data: bytes) -> str | None:
        """What is wrong with ``data``, records r0..r1-1 (of the length asked), or None."""
        ends = (self.offsets[r0 : r1 + 1] - self.offsets[r0]).tolist()
        for r, (a, b) in enumerate(zip(ends, ends[1:]), r0):
            if zlib.crc32(memoryview(data)[a:b]) != int(self.crcs[r]):
                return f"record {r} fails its CRC-32"
        return None

    def make_room(self, nbytes: int) -> None:
        """Evict blocks no process holds, least recently taken first, across every pack of
        the folder, until ``nbytes`` more fit under the limit; call under the folder lock."""
        if self.limit is None:
            return
        root = self.folder.parent
        names = [e.name for e in os.scandir(root) if (root / e.name / "bounds").exists()]
        packs = [_folder(root / n) for n in names if not n.startswith(".")]
        used = allocated(root) + 2 * 4096 + sum(int(p.sizes[p.state == -1].sum()) for p in packs)
        states = [(t, k, b) for k, p in enumerate(packs) for b, t in enumerate(p.state.tolist())]
        for _, k, b in sorted(s for s in states if s[0] > 0):  # least recently taken first
            if used + nbytes <= self.limit:
                return
            used -= packs[k].evict(b)
        if used + nbytes > self.limit:
            raise InvalidArgumentError(
                f"{self.store.url}: cache_limit {self.limit} bytes cannot hold {nbytes} more: "
                f"{used} are held by reads under way; raise cache_limit or use smaller batches"
            )
