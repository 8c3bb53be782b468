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
hangs surfaces as a ``PackError`` naming its files; no wait is unbounded.
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import signal
import sys
from collections import deque
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

from imgpack.errors import PackError
from imgpack.format.codec import rgb_to_yuv420
from imgpack.packer import decode
from imgpack.packer.digest import RecordDigest, digest_from_histogram, digest_stored
from imgpack.packer.jpeg import encode_image
from imgpack.packer.passthrough import stored_as_is
from imgpack.packer.settings import DecodeSettings
from imgpack.packer.sources.pool import WorkerPool
from imgpack.packer.sources.source import Fetch, Part, Payload, Skip, span

__all__ = ["WORKER_TIMEOUT_S", "ParallelDecoder", "decode_one", "decode_sample", "plan"]

WORKER_TIMEOUT_S = 300.0  # longest wait for one chunk; decode refuses bombs, so only hangs hit it
_CHUNK_BYTES = 32 << 20  # results of one chunk
_WINDOW_BYTES = 256 << 20  # results of all chunks in flight

# (stored bytes, (RecordDigest, RecordGeometry, (width, height), stored as it came)) or
# (None, reason); a worker that wrote the bytes into the shared ring sends their length
# instead
Outcome = tuple[Any, Any]


def decode_one(data: str | bytes, name: str, settings: DecodeSettings) -> Outcome:
    """Decode one image, a file's path or its encoded bytes, named ``name`` in the pack:
    (stored bytes, (digest, geometry, (width, height), as_is)), or (None, reason) for a bad
    one. The record is encoded here (``settings.codec``), in the worker; ``as_is``: a jpeg
    record that is the source's own bytes (``passthrough``).

    Call it inside ``decode.pillow_quiet()``, or Pillow's warnings about odd files show.
    """
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return None, "file name is not valid UTF-8, so it cannot be stored in the index"
    try:
        if settings.codec == "jpeg":
            kept = stored_as_is(data, settings)
            if kept is not None:
                stored, digest, geometry, size = kept
                return stored, (digest, geometry, size, True)
        decoded = decode.decode_record(data, settings, silence=False)
        if isinstance(decoded, str):  # a bad file: its reason
            return None, decoded
        img, geometry = decoded
        w, h = img.size
        if settings.codec == "raw":
            pixels = img.tobytes()
            digest: RecordDigest = digest_from_histogram(pixels, img.histogram(), settings.channels)
        else:  # the CRC of what is stored, the sums of what a reader gets back
            if settings.codec == "jpeg":
                pixels = encode_image(img, settings.quality)
            else:
                pixels = rgb_to_yuv420(np.asarray(img)).tobytes()
            digest = digest_stored(pixels, settings.codec, w, h, settings.channels)
    except Exception as exc:  # a bug or resource failure, not a bad file: stop, naming it
        raise PackError(f"{name}: unexpected {type(exc).__name__} while decoding: {exc}") from exc
    return pixels, (digest, geometry, (w, h), False)


def decode_sample(fetch: Fetch, name: str, payload: Payload, settings: DecodeSettings) -> Outcome:
    """``decode_one`` of what a source's payload stands for (``fetch``), or its Skip."""
    data = payload if isinstance(payload, Skip) else fetch(payload)
    if isinstance(data, Skip):
        return None, data.reason
    return decode_one(data, name, settings)


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


_STATE: dict[str, Any] = {}


def _init_worker(fetch: Fetch, settings: DecodeSettings, parent: int, ring, slot: int) -> None:
    # Ctrl-C reaches the whole process group; only the parent decides what happens.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(parent)
    _STATE.update(fetch=fetch, settings=settings, ring=ring, slot=slot)


def _decode_chunk(items: list[tuple[str, Payload]], offset: int) -> list[Outcome]:
    """Decode ``items`` (name, payload); with a ring, record j goes to ``offset + j * slot``
    in it, where a slot holds the largest record the pack's bound gives (``slot``), and its
    length comes back; a record that does not fit comes back as bytes."""
    fetch, settings, ring = _STATE["fetch"], _STATE["settings"], _STATE["ring"]
    slot = _STATE["slot"]
    out = []
    with decode.pillow_quiet():
        for j, (name, payload) in enumerate(items):
            pixels, info = decode_sample(fetch, name, payload, settings)
            if pixels is not None and ring is not None and len(pixels) <= slot:
                # a larger one (a jpeg source stored as it came, with its metadata) is pickled
                n = len(pixels)
                ring[offset + j * slot : offset + j * slot + n] = pixels
                pixels = n
            out.append((pixels, info))
    return out


def _die_with_parent(parent: int) -> None:
    """If the parent is SIGKILLed, its workers go too instead of decoding for no one."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _names(chunk: list[tuple[int, str, int, Payload]]) -> str:
    first, last = chunk[0], chunk[-1]
    return span(first[1], last[1], last[0] - first[0] + 1, "files")


def _nbytes(payload: Payload) -> int:
    return len(payload) if isinstance(payload, bytes) else 0


class ParallelDecoder:
    """Context manager; iterate (i, name, label, pixels, info) for ``items`` in order.

    ``items`` yields (i, name, label, payload) for the ``count`` samples still to pack; each
    worker turns a payload into an image with ``fetch`` (``sources.source``). Chunks are cut
    as they are submitted, at ``plan``'s count or at the bytes a window may hold, whichever
    comes first, so payloads that carry images stay bounded in memory too; and where one
    unit's ``Part`` payloads end (a Parquet row group, up to ``unit_size`` samples), so that
    no chunk straddles two units: a worker reads a unit once per chunk of it that it gets,
    once where ``plan`` gives chunks of a whole unit.
    """

    def __init__(
        self,
        items,
        count: int,
        fetch: Fetch,
        settings: DecodeSettings,
        *,
        workers: int,
        record_bytes: int,
        start_method: str | None = None,
        unit_size: int = 1,
    ) -> None:
        """``record_bytes``: the most one record can take (the pack's bound)."""
        self.items, self.fetch = iter(items), fetch
        self.settings, self.workers = settings, workers
        self.record_bytes = record_bytes
        self.chunksize, self.window, self.workers = plan(count, workers, record_bytes, unit_size)
        self._held = None  # the item that began the next unit
        self.chunk_bytes = max(1, _WINDOW_BYTES // self.window)  # payload bytes per chunk
        if start_method is None:
            start_method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        self.start_method = start_method
        self._pending: deque = deque()
        self._finished = False
        self._ex: WorkerPool | None = None

    def __enter__(self) -> ParallelDecoder:
        slot = self.chunksize * self.record_bytes
        # MAP_SHARED anonymous memory: inherited by forked workers, not limited by /dev/shm
        self._ring = mmap.mmap(-1, slot * self.window) if self.start_method == "fork" else None
        self._ex = WorkerPool(
            self.workers,
            self.start_method,
            _init_worker,
            (self.fetch, self.settings, os.getpid(), self._ring, self.record_bytes),
        )
        self._submitted = 0
        for _ in range(self.window):  # starts every worker now, before any thread of ours
            if not self._submit():
                break
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
            nbytes += _nbytes(item[3])
        return chunk

    def _submit(self) -> bool:
        chunk = self._chunk()
        if not chunk:
            return False
        offset = (self._submitted % self.window) * self.chunksize * self.record_bytes
        future = self._ex.submit(_decode_chunk, [(c[1], c[3]) for c in chunk], offset)
        self._pending.append((chunk, offset, future))
        self._submitted += 1
        return True

    def __iter__(self):
        rb = self.record_bytes
        ring = memoryview(self._ring) if self._ring is not None else None
        while self._pending:
            chunk, offset, future = self._pending[0]
            timeout = WORKER_TIMEOUT_S
            try:
                results = future.result(timeout=timeout)
            except FuturesTimeout:
                raise PackError(
                    f"{_names(chunk)}: no result from a worker in {timeout:g} s "
                    f"(a hung file system?)"
                ) from None
            except BrokenProcessPool:
                raise self._died(chunk) from None
            self._pending.popleft()
            for j, ((i, name, label, _), (pixels, info)) in enumerate(zip(chunk, results)):
                if isinstance(pixels, int):  # its length, in the ring
                    pixels = ring[offset + j * rb : offset + j * rb + pixels]
                yield i, name, label, pixels, info
            try:
                self._submit()  # only now: the new chunk reuses the slot just consumed
            except BrokenProcessPool:
                raise self._died(self._pending[0][0] if self._pending else chunk) from None
        self._finished = True

    def _died(self, chunk) -> PackError:
        # the pool cannot say whose file killed it, only what was in flight
        last = self._pending[-1][0] if self._pending else chunk
        return PackError(
            f"{_names(chunk[:1] + last[-1:])}: a worker process died while decoding "
            f"a file in this range (killed by the OS, out of memory?)"
        )

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(kill=exc_type is not None or not self._finished)

    def close(self, *, kill: bool) -> None:
        """Stop the pool: let idle workers exit, or terminate busy ones; bounded waits only."""
        if self._ex is None:
            return
        ex, self._ex = self._ex, None
        self._ring = None  # unmapped once the last view of it is gone
        ex.stop(kill=kill)
