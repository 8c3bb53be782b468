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
(int64 per block: 0 absent, -1 being fetched, else when it was last taken). Processes
agree through two kinds of lock: ``<cache_dir>/lock`` (``flock``), held only while one
changes what is present, and byte-range locks (``lockf``) on the folder's ``pins`` file:
byte b is read-locked by every process holding block b (its reads may be under way) and
write-locked by the one fetching or evicting it. So a block is fetched once (the others
poll its lock, which its fetcher's death also frees), and eviction, which punches the
block out of the file (``fallocate``) so that the folder's allocated bytes stay under
``cache_limit``, takes only blocks no process holds, least recently taken first. Each
process holds the blocks of its reads under way; without a limit it keeps every block
it has read (a sample is a view of the mapping), under one only its last (a sample is a
copy, ``mirror.RemotePacks.own``), so that the holds of several workers never fill it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import threading
import time
import zlib
from collections import OrderedDict
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.errors import InvalidArgumentError, PackChangedError
from imgpack.remote import RemoteError
from imgpack.remote.store import Store

__all__ = ["BlockCache", "BLOCK_BYTES", "folder_lock", "allocated", "parse_limit"]

BLOCK_BYTES = 8 << 20  # one request (the block order's block): streams, and starts fast
MIN_BLOCK_BYTES = 16 << 10  # a small limit's blocks (``limit / 64``) are no smaller
_WAIT_S = 600.0  # a read waiting on another thread's fetch of its block (itself bounded)
_PUNCH = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update(KIB=1 << 10, MIB=1 << 20, GIB=1 << 30, TIB=1 << 40)
# the C library already loaded: ``ctypes.util.find_library`` runs ldconfig, and a worker
# forked during that run kept its pipe open, so the parent waited under the folder lock
_LIBC = ctypes.CDLL(None, use_errno=True)


def parse_limit(value: Any) -> int | None:
    """``cache_limit``: None, bytes, or a string such as "50GB" or "512MiB"."""
    if value is None:
        return None
    text = str(value).strip().upper().replace(" ", "")
    number = text.rstrip("KMGTIB")
    unit = text[len(number) :]
    try:
        n = float(number) * _UNITS[unit] if not isinstance(value, bool) else -1
    except (ValueError, KeyError):
        n = -1
    if not 0 < n < float("inf") or isinstance(value, float) and not value.is_integer():
        raise InvalidArgumentError(
            f"cache_limit {value!r} is not a size: give bytes (an int) or a string like '50GB'"
        )
    return value if isinstance(value, int) else int(n)  # an int exactly, however large


_threads = threading.Lock()  # guards _LOCAL between this process's threads


def _new_lock() -> None:
    global _threads
    _threads = threading.Lock()


os.register_at_fork(after_in_child=_new_lock)


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
    total = 0
    for entry in os.scandir(cache_dir):
        if entry.is_dir(follow_symlinks=False):
            total += sum(f.stat().st_blocks * 512 for f in os.scandir(entry.path))
    return total


def _punch(path: Path, start: int, length: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        args = (ctypes.c_int(fd), ctypes.c_int(_PUNCH), ctypes.c_int64(start))
        if _LIBC.fallocate(*args, ctypes.c_int64(length)) != 0:
            err = ctypes.get_errno()
            raise InvalidArgumentError(
                f"{path.parent.parent}: cannot free space in the cache ({os.strerror(err)}); "
                f"give a cache_dir on a local file system (ext4, xfs, tmpfs)"
            )
    finally:
        os.close(fd)


class _Local:
    """What one process has of one pack folder: open files, pins, fetches under way."""

    def __init__(self, folder: Path, bin_name: str) -> None:
        self.bin = os.open(folder / bin_name, os.O_RDWR)
        self.blocks = os.open(folder / "blocks", os.O_RDWR)
        self.pins = os.open(folder / "pins", os.O_RDWR | os.O_CREAT, 0o644)  # never closed:
        # closing any descriptor of it would drop every lock this process holds on it
        self.held: OrderedDict[int, None] = OrderedDict()  # pinned here, oldest first
        self.busy: dict[int, int] = {}  # reads under way per block: never unpinned
        self.fetching: dict[int, Future] = {}
        self.mutex = threading.Lock()


_LOCAL: dict[tuple[int, str], _Local] = {}  # (pid, folder): one per process and pack


def _pin(fd: int, b: int, how: int) -> bool:
    """lockf byte ``b`` of a pins file; False where a non-blocking lock is refused. Only
    ever non-blocking: a blocking record lock is checked for cycles between processes,
    and with several threads per process those cycles are false (EDEADLK)."""
    try:
        fcntl.lockf(fd, how, 1, b)
    except OSError:
        return False
    return True


def _states(folder: Path) -> np.ndarray:
    return np.fromfile(folder / "blocks", dtype="<i8")


class BlockCache:
    """The blocks of one remote pack in its cache folder; pickles as its names only.

    ``crcs`` and ``record_bytes`` (start of every record and the end, in the .bin) are the
    pack index's; ``limit``: the folder's bound in bytes, or None."""

    def __init__(
        self, folder: Path, bin_name: str, store: Store, limit: int | None, identity: tuple
    ) -> None:
        self.folder, self.bin_name, self.store, self.limit = folder, bin_name, store, limit
        self.identity = identity  # (size, version) when opened
        self._setup()

    def __getstate__(self) -> dict[str, Any]:
        keep = ("folder", "bin_name", "store", "limit", "identity")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def _setup(self) -> None:
        bounds = np.fromfile(self.folder / "bounds", dtype="<i8").reshape(-1, 2)
        self.first_record, self.first_byte = bounds[:, 0], bounds[:, 1]
        self.hold = self.count if self.limit is None else 1  # blocks kept pinned after a read
        self.crcs: np.ndarray | None = None  # set by the dataset side (mirror.attach)
        self.offsets: np.ndarray | None = None

    @property
    def count(self) -> int:
        return len(self.first_byte) - 1

    def _local(self) -> _Local:
        key = (os.getpid(), str(self.folder))
        local = _LOCAL.get(key)
        if local is None:
            with _threads:  # one per process: threads that start together share it
                if key not in _LOCAL:
                    _LOCAL[key] = _Local(self.folder, self.bin_name)
                local = _LOCAL[key]
        return local

    def blocks_of(self, records: np.ndarray) -> np.ndarray:
        """The blocks holding ``records`` (in range), in order of first appearance."""
        blocks = np.searchsorted(self.first_record, records, side="right") - 1
        _, first = np.unique(blocks, return_index=True)
        return blocks[np.sort(first)]

    @contextlib.contextmanager
    def reading(self, records: np.ndarray):
        """The blocks of ``records`` present and pinned while the block runs; afterwards
        the last ``hold`` blocks stay pinned (a sample's view may outlive its read)."""
        local = self._local()
        blocks = []
        try:
            for b in self.blocks_of(records).tolist():
                self.take(b)
                blocks.append(b)
            yield
        finally:
            with local.mutex:
                for b in blocks:
                    local.busy[b] -= 1
                    if not local.busy[b]:
                        del local.busy[b]
                spare = [b for b in local.held if b not in local.busy]
                for old in spare[: max(0, len(spare) - self.hold)]:
                    del local.held[old]
                    _pin(local.pins, old, fcntl.LOCK_UN)

    def take(self, b: int, *, hold: bool = True) -> None:
        """Block ``b`` present (and, ``hold``, pinned here for a read, which ``reading``
        ends): found, waited for or fetched."""
        local = self._local()
        with local.mutex:
            if b in local.held:
                if hold:
                    local.held.move_to_end(b)
                    local.busy[b] = local.busy.get(b, 0) + 1
                return
            future = local.fetching.get(b)
            mine = future is None
            if mine:
                future = local.fetching[b] = Future()
        if not mine:  # another thread of this process fetches it: its outcome is ours
            future.result(timeout=_WAIT_S)
            return self.take(b, hold=hold)
        try:
            self._acquire(local, b, hold)
            if not hold:  # fetched for later: pinned by no one here
                with local.mutex:
                    if b not in local.busy:
                        local.held.pop(b, None)
                        _pin(local.pins, b, fcntl.LOCK_UN)
        except BaseException as e:
            with local.mutex:
                del local.fetching[b]
            future.set_exception(e)
            raise
        with local.mutex:
            del local.fetching[b]
        future.set_result(None)

    def _state(self, local: _Local, b: int, value: int | None = None) -> int:
        if value is not None:
            os.pwrite(local.blocks, int(value).to_bytes(8, "little", signed=True), 8 * b)
            return value
        return int.from_bytes(os.pread(local.blocks, 8, 8 * b), "little", signed=True)

    def _hold(self, local: _Local, b: int, read: bool) -> None:
        with local.mutex:  # before an evictor of this process can look
            local.held[b] = None
            if read:
                local.busy[b] = local.busy.get(b, 0) + 1

    def _acquire(self, local: _Local, b: int, read: bool) -> None:
        """Block ``b`` present and read-locked by this process: found, waited for or fetched."""
        while True:
            with folder_lock(self.folder.parent):
                state = self._state(local, b)
                if state > 0:
                    _pin(local.pins, b, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    self._state(local, b, time.time_ns())
                    return self._hold(local, b, read)
                # absent, or marked by a fetcher: alive while it holds the write lock
                mine = _pin(local.pins, b, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if mine:
                    self.make_room(self.size(b))
                    self._state(local, b, -1)
            if mine:
                return self._fetch(local, b, read)
            while not _pin(local.pins, b, fcntl.LOCK_SH | fcntl.LOCK_NB):
                time.sleep(0.005)  # its fetcher's read is bounded; its death frees the lock
            _pin(local.pins, b, fcntl.LOCK_UN)  # then look again

    def size(self, b: int) -> int:
        return int(self.first_byte[b + 1] - self.first_byte[b])

    def _fetch(self, local: _Local, b: int, read: bool) -> None:
        start, end = int(self.first_byte[b]), int(self.first_byte[b + 1])
        r0, r1 = int(self.first_record[b]), int(self.first_record[b + 1])
        try:
            try:
                data = self.store.read(start, end, f"records {r0}..{r1 - 1}", self._checker(r0, r1))
            except RemoteError:
                if self.store.identity() != tuple(self.identity):
                    raise PackChangedError(
                        f"{self.store.url}: the object changed since the dataset opened it "
                        f"(reading records {r0}..{r1 - 1}); reopen the dataset"
                    ) from None
                raise
            os.pwrite(local.bin, data, start)
            os.fdatasync(local.bin)
        except BaseException:
            with folder_lock(self.folder.parent):
                self._state(local, b, 0)
                _pin(local.pins, b, fcntl.LOCK_UN)
            raise
        with folder_lock(self.folder.parent):
            self._state(local, b, time.time_ns())
            _pin(local.pins, b, fcntl.LOCK_SH | fcntl.LOCK_NB)  # write lock -> read lock
            self._hold(local, b, read)

    def _checker(self, r0: int, r1: int):
        offsets, crcs, base = self.offsets, self.crcs, int(self.offsets[r0])

        def check(data: bytes) -> str | None:
            view = memoryview(data)
            for r in range(r0, r1):
                a, b = int(offsets[r]) - base, int(offsets[r + 1]) - base
                if zlib.crc32(view[a:b]) != int(crcs[r]):
                    return f"record {r} fails its CRC-32"
            return None

        return check

    def make_room(self, nbytes: int) -> None:
        """Evict blocks no process holds, least recently taken first, across every pack of
        the folder, until ``nbytes`` more fit under the limit; call under the folder lock."""
        if self.limit is None:
            return
        root = self.folder.parent
        folders = [Path(e.path) for e in os.scandir(root) if (Path(e.path) / "bounds").exists()]
        states = {f: _states(f) for f in folders}
        fetching = sum(
            int(np.diff(np.fromfile(f / "bounds", "<i8").reshape(-1, 2)[:, 1])[s == -1].sum())
            for f, s in states.items()
        )
        used = allocated(root) + fetching + 2 * 4096
        if used + nbytes <= self.limit:
            return
        order = sorted((int(t), f, b) for f, s in states.items() for b, t in enumerate(s) if t > 0)
        for _, folder, b in order:
            used -= self._evict(folder, b)
            if used + nbytes <= self.limit:
                return
        raise InvalidArgumentError(
            f"{self.store.url}: cache_limit {self.limit} bytes cannot hold {nbytes} more: "
            f"{used} are pinned by the reads under way; raise cache_limit or use smaller batches"
        )

    def _evict(self, folder: Path, b: int) -> int:
        """Punch block ``b`` of ``folder`` out unless some process holds it; bytes freed."""
        local = _LOCAL.get((os.getpid(), str(folder)))
        if local is not None and b in local.held:
            return 0
        pins = local.pins if local else os.open(folder / "pins", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not _pin(pins, b, fcntl.LOCK_EX | fcntl.LOCK_NB):
                return 0
            try:
                bounds = np.fromfile(folder / "bounds", "<i8").reshape(-1, 2)[:, 1]
                start, end = int(bounds[b]), int(bounds[b + 1])
                with open(folder / "blocks", "r+b") as f:
                    os.pwrite(f.fileno(), (0).to_bytes(8, "little"), 8 * b)
                _punch(next(p for p in folder.iterdir() if p.suffix == ".bin"), start, end - start)
                return end - start
            finally:  # a failed punch must not leave the block locked by this process
                _pin(pins, b, fcntl.LOCK_UN)
        finally:
            if local is None:
                os.close(pins)
