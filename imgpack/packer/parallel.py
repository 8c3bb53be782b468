"""Decode samples in worker processes and hand the results back in source order.

Each sample reaches a worker as its source's payload (a name, a byte range, the bytes
themselves), which the source's ``Fetch`` turns into a path or bytes there, so a
source that can be read in place (a folder, a tar shard) sends no image through a pipe.
Workers also digest each record (CRC, channel sums), so the main process does
no per-pixel work: it only writes. Pixels travel through a ring of shared
memory when workers are forked (one copy in the worker, one ``write`` from the
ring; only the small digests are pickled) and as pickled bytes when spawned.
A sliding window of chunk futures keeps every worker busy while bounding the
memory held by finished-but-unwritten results: chunk k's ring slot is handed
to chunk k + window only after chunk k was consumed. A worker that dies or
hangs surfaces as a ``PackError`` naming its files; no wait is unbounded. One worker
(``workers=1``) is the same pipeline with this process as its pool (``InProcess``): the
same chunks, decoded as they are asked for.

The same module lists many source files on every core (``map_in_processes``, one call per
file, results in the files' order): a source is listed before anything is decoded, and tar
headers cost ``tarfile`` some tens of microseconds per member, minutes for ImageNet's 2.5
million. Both pools stop in bounded time (``WorkerPool.stop``); workers leave Ctrl-C to the
parent.
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures.process import BrokenProcessPool
from contextlib import suppress
from types import SimpleNamespace
from typing import Any

from imgpack.errors import PackError
from imgpack.packer import decode
from imgpack.packer.decode import DecodeSettings
from imgpack.packer.sources.source import Fetch, Part, Payload, Skip, printable_path, span
from imgpack.packer.writer import digest_stored, encode_record

__all__ = ["ParallelDecoder", "WorkerPool", "decode_sample", "map_in_processes"]

WORKER_TIMEOUT_S = 300.0  # longest wait for one chunk; decode refuses bombs, so only hangs hit it
LIST_TIMEOUT_S = 600.0  # longest wait for one file's listing: only a hung file system hits it
STOP_TIMEOUT_S = 10.0  # longest wait for a pool's workers to exit

_DEFAULT_METHOD = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
_CHUNK_BYTES = 32 << 20  # results of one chunk
_WINDOW_BYTES = 256 << 20  # results of all chunks in flight

# (stored bytes, (RecordDigest, RecordGeometry, (width, height), stored as it came)) or
# (None, reason); a worker that wrote the bytes into the shared ring sends their length
# instead
Outcome = tuple[Any, Any]


def decode_sample(fetch: Fetch, name: str, payload: Payload, settings: DecodeSettings) -> Outcome:
    """Decode the image a source's payload stands for (``fetch`` turns it into a file's path
    or its encoded bytes), named ``name`` in the pack: (stored bytes, (digest, geometry,
    (width, height), as_is)), or (None, reason) for a bad one or a payload that is a
    ``Skip``. The record is encoded here (``settings.codec``), in the worker; ``as_is``: a
    jpeg record that is the source's own bytes (``decode.Kept``).

    Call it inside ``decode.pillow_quiet()``, or Pillow's warnings about odd files show.
    """
    data = payload if isinstance(payload, Skip) else fetch(payload)
    if isinstance(data, Skip):
        return None, data.reason
    if printable_path(name) != name:  # as the index's JSON would hold it: not the same name
        return None, "file name is not valid UTF-8, so it cannot be stored in the index"
    try:
        decoded = decode.decode_record(data, settings)
        if isinstance(decoded, str):  # a bad file: its reason
            return None, decoded
        img, geometry = decoded
        if isinstance(img, decode.Kept):  # its sums: of the pixels a reader decodes, decoded
            pixels, back, size = img.stream, img.pixels, geometry.source_size
        elif settings.codec == "raw":  # its sums: of ``img`` itself, pixels still in cache
            pixels, back, size = img.tobytes(), img, img.size
        else:  # the CRC of what is stored, the sums of what a reader gets back
            pixels, back = encode_record(img, settings.codec, settings.quality), None
            size = img.size
        digest = digest_stored(pixels, settings.codec, *size, settings.channels, back)
    except Exception as exc:  # a bug or resource failure, not a bad file: stop, naming it
        raise PackError(f"{name}: unexpected {type(exc).__name__} while decoding: {exc}") from exc
    return pixels, (digest, geometry, size, isinstance(img, decode.Kept))


def plan(n: int, workers: int, record_bytes: int, unit: int = 1) -> tuple[int, int, int]:
    """(files per chunk, chunks in flight, workers): >= 4 chunks per worker where the bytes
    allow, a chunk holding a whole unit of ``unit`` samples read together
    (``sources.source.Part``) where it fits, else a unit is cut into chunks.

    The chunks in flight hold at most max(256 MiB, 2 x ``record_bytes``): each worker needs
    a chunk in flight beyond the one being written, so where records are so large that
    ``workers`` + 1 chunks of one record exceed 256 MiB, fewer workers decode."""
    most = (_CHUNK_BYTES // record_bytes, _WINDOW_BYTES // ((workers + 1) * record_bytes))
    chunk = max(1, min(max(16, unit), n // (workers * 4), *most))
    fits = _WINDOW_BYTES // (chunk * record_bytes)  # chunks the bound holds
    workers = max(1, min(workers, fits - 1))
    return chunk, max(workers + 1, min(4 * workers, fits)), workers


_STATE: list[Any] = []  # a worker's (fetch, settings, ring, slot), set once by _init_worker


def _init_worker(parent: int, *state: Any) -> None:
    """Every worker of ours, the decoders' and the listing's (which keeps no state)."""
    # Ctrl-C reaches the whole process group; only the parent decides what happens.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # if the parent is SIGKILLed, its workers go too instead of decoding for no one
    if sys.platform.startswith("linux"):
        with suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
    _STATE[:] = state


def _decode_chunk(items: list[tuple[str, Payload]], offset: int, state=None) -> list[Outcome]:
    """Decode ``items`` (name, payload) under ``state``, (fetch, settings, ring, slot): a
    worker's own (``_STATE``) or, in this process, the run's. With a ring, record j goes to
    ``offset + j * slot`` in it, where a slot holds the largest record the pack's bound
    gives, and its length comes back; a record that does not fit comes back as bytes."""
    fetch, settings, ring, slot = state or _STATE
    out = []
    with decode.pillow_quiet():
        for j, (name, payload) in enumerate(items):
            pixels, info = decode_sample(fetch, name, payload, settings)
            if pixels is not None and ring is not None and len(pixels) <= slot:
                # a larger one (a jpeg source stored as it came, with its metadata) is pickled
                ring[offset + j * slot : offset + j * slot + len(pixels)] = pixels
                pixels = len(pixels)
            out.append((pixels, info))
    return out


def _names(chunk: list[tuple[int, str, int, Payload]]) -> str:
    """The files of a chunk ((i, name, label, payload) each), in one line: 'a .. b (n files)'."""
    return span(chunk[0][1], chunk[-1][1], chunk[-1][0] - chunk[0][0] + 1, "files")


class ParallelDecoder:
    """Context manager; iterate (i, name, label, pixels, info) for the samples of ``work``
    (the run's ``PackPlan``) from ``done`` on, in order.

    Each worker turns a payload into an image with ``fetch`` (``sources.source``). Chunks
    are cut as they are submitted, at ``plan``'s count or at the bytes a window may hold,
    whichever comes first, so payloads that carry images stay bounded in memory too; and
    where one unit's ``Part`` payloads end (a Parquet row group, up to the source's
    ``unit_size`` samples), so that no chunk straddles two units: a worker reads a unit
    once per chunk of it that it gets, once where ``plan`` gives chunks of a whole unit.
    ``record_bytes``: the most one record can take (the pack's bound). ``workers`` 1:
    no process is started, the chunks are decoded here.
    """

    def __init__(self, work, done, fetch: Fetch, workers, record_bytes, start_method=None) -> None:
        count, unit = len(work.files) - done, work.source.unit_size
        self.chunksize, self.window, processes = plan(count, workers, record_bytes, unit)
        self.items, self.record_bytes = work.samples(done), record_bytes
        self._held = None  # the item that began the next unit
        self.chunk_bytes = max(1, _WINDOW_BYTES // self.window)  # payload bytes per chunk
        self._pending: deque = deque()  # (chunk, ring offset, future), in order
        # MAP_SHARED anonymous memory: inherited by forked workers, not limited by /dev/shm
        fork = workers > 1 and (start_method or _DEFAULT_METHOD) == "fork"
        self._ring = mmap.mmap(-1, self.chunksize * record_bytes * self.window) if fork else None
        state = (fetch, work.settings, self._ring, record_bytes)
        if workers == 1:  # the same chunks, decoded in this process as they are asked for
            self._ex: WorkerPool | InProcess = InProcess(state)
        else:
            self._ex = WorkerPool(processes, start_method, _init_worker, (os.getpid(), *state))

    def __enter__(self) -> ParallelDecoder:
        for slot in range(self.window):  # starts every worker now, before any thread of ours
            self._submit(slot * self.chunksize * self.record_bytes)
        return self

    def _chunk(self) -> list[tuple[int, str, int, Payload]]:
        chunk, nbytes, unit = [], 0, None
        while len(chunk) < self.chunksize and nbytes < self.chunk_bytes:
            item, self._held = self._held or next(self.items, None), None
            if item is None:
                break
            if isinstance(item[3], Part):
                if chunk and unit is not None and item[3].unit != unit:
                    self._held = item  # the next unit starts the next chunk
                    break
                unit = item[3].unit
            chunk.append(item)
            nbytes += len(item[3]) if isinstance(item[3], bytes) else 0  # images it carries
        return chunk

    def _submit(self, offset: int) -> None:
        """Hand the pool the next chunk, if any is left, its records to go to the ring's slot
        at ``offset``."""
        chunk = self._chunk()
        if chunk:
            future = self._ex.submit(_decode_chunk, [(c[1], c[3]) for c in chunk], offset)
            self._pending.append((chunk, offset, future))

    def __iter__(self):
        rb = self.record_bytes
        ring = None if self._ring is None else memoryview(self._ring)
        while self._pending:
            chunk, offset, future = self._pending[0]
            try:
                late = f"{_names(chunk)}: no result from a worker"
                results = _result(future, WORKER_TIMEOUT_S, late)
                self._pending.popleft()
                for j, ((i, name, label, _), (pixels, info)) in enumerate(zip(chunk, results)):
                    if isinstance(pixels, int):  # its length, in the ring
                        pixels = ring[offset + j * rb : offset + j * rb + pixels]
                    yield i, name, label, pixels, info
                self._submit(offset)  # only now: the new chunk reuses the slot just consumed
            except BrokenProcessPool:  # the pool cannot say whose file killed it, only what
                # was in flight: the chunks from the one waited on (or handed out) to the last
                flight = [c for c, _, _ in self._pending] or [chunk]
                raise PackError(
                    f"{_names(flight[0][:1] + flight[-1][-1:])}: a worker process died while "
                    f"decoding a file in this range (killed by the OS, out of memory?)"
                ) from None

    def __exit__(self, exc_type, exc, tb) -> None:
        """Stop the pool: let idle workers exit, or terminate busy ones (a failure, or chunks
        still in flight when the caller stopped early); bounded waits only."""
        self._ex.stop(kill=exc_type is not None or bool(self._pending))


class InProcess:
    """The pool of ``workers=1``: this process, each chunk decoded when its result is asked
    for, under the run's ``state`` as a worker decodes under its own, so one worker runs the
    very pipeline many do."""

    def __init__(self, state: tuple) -> None:
        self.state = state

    def submit(self, fn: Callable[..., Any], *args: Any) -> SimpleNamespace:
        return SimpleNamespace(result=lambda timeout=None: fn(*args, self.state))

    def stop(self, *, kill: bool) -> None:
        """Nothing to stop: no process was started, and a chunk is decoded only when asked."""


def _result(future: Any, timeout: float, late: str) -> Any:
    """``future``'s result, or a PackError: ``late``, after ``timeout`` seconds of waiting."""
    try:
        return future.result(timeout=timeout)
    except FuturesTimeout:
        raise PackError(f"{late} in {timeout:g} s (a hung file system?)") from None


class WorkerPool(ProcessPoolExecutor):
    """A ``ProcessPoolExecutor`` that knows its worker processes, through the public
    mechanism a pool starts them with: its ``mp_context``, whose ``Process`` is recorded
    here, so that ``stop`` ends them in bounded time. ``method``: "fork" or "spawn" (None:
    fork where available)."""

    def __init__(self, workers: int, method: str | None, initializer, initargs=()) -> None:
        base = mp.get_context(method or _DEFAULT_METHOD)
        self.processes = started = []  # every process the pool starts, as it starts it

        class Context(type(base)):
            def Process(self, *args, **kwargs):  # noqa: N802 - multiprocessing's name
                process = base.Process(*args, **kwargs)
                started.append(process)
                return process

        super().__init__(workers, Context(), initializer=initializer, initargs=initargs)

    def stop(self, *, kill: bool) -> None:
        """Let idle workers exit, or (``kill``) terminate busy ones; one that ignores it is
        killed at the deadline (``STOP_TIMEOUT_S``): no work is worth a hang. Both pools of
        the packer stop this way, the listing's and the decoders'."""
        if kill:
            for p in self.processes:
                p.terminate()
        else:  # idle workers exit once told to
            self.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + STOP_TIMEOUT_S  # one deadline for all of them
        for p in self.processes:  # every one started: a pool records a process as it starts it
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        # every worker is gone: the pool's own thread sees it at once, fails what was in
        # flight and ends; joining it here (not at interpreter exit, where it raced the
        # closing of its wakeup pipe) leaves nothing of the pool behind
        self.shutdown(wait=True, cancel_futures=True)

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(kill=exc_type is not None)  # a generator closed early: GeneratorExit


def map_in_processes(
    fn: Callable[..., Any], items: Sequence[tuple], *, workers: int, names: Sequence[str]
) -> Iterator[Any]:
    """``fn(*item)`` for each item, in order: in this process for one item or one worker,
    else in up to ``workers`` processes. ``names[k]`` names item k in a timeout's message."""
    workers = min(workers, len(items))
    if workers <= 1:
        yield from (fn(*item) for item in items)
        return
    with WorkerPool(workers, None, _init_worker, (os.getpid(),)) as pool:
        futures = [pool.submit(fn, *item) for item in items]
        for name, future in zip(names, futures):
            yield _result(future, LIST_TIMEOUT_S, f"{name}: not listed")
