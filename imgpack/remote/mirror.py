"""URLs <-> local packs: a pack at a URL opened through a local copy, a pack made locally
and published at a URL.

Reading (``open_remote``): each pack's index and the metadata of its .bin (header, labels,
checksums, paths, record fields: everything but the records) are fetched into a sparse
cache file of the pack's full size, so that ``read_index`` validates it as it validates a
local pack; a manifest at a URL is copied beside them with its shards pointing at their
cache folders. ``RemotePacks`` is what the dataset keeps: the packs' block caches, asked to
``reading`` the records a read is about to touch (fetched, and pinned while it runs), and
a prefetch per pass (``Ahead``).

The prefetch: the loader knows a pass's order before it starts, so ``Ahead`` walks it a
few batches ahead of the batches handed over (``done()``), and ``IN_FLIGHT`` daemon
threads take the walk's blocks in turn and ask the pack's cache for each, so that as many
requests are under way at once. A batch the loop reaches first is fetched by the read
itself (the cache fetches each block once), so the first batch waits for its own blocks
only. The threads are stopped and joined at exit (``imgpack.reader.run``) and when the
pass ends; a fetch error there is left for the read of that batch to raise.

Publishing (``pack-images SRC... s3://bucket/train.bin``: ``staged``, ``published``): the
pack is written in a local folder (``--work DIR``, kept, or by default one under the
system's temporary folder named after the command's URLs and paths, removed once the pack
is published), then uploaded data file first and index last: a reader opens a pack by its
index, so it never sees half a pack. The default folder is the same for the same command,
so a rerun after a failure continues the pack there, as a local output's rerun does; and a
rerun after success finds the published index (``published``) and, for the same command,
nothing to do. Tar shards and Parquet files named by URL (globs and brace ranges too) are
fetched into that folder first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import re
import shutil
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Callable

import numpy as np

from imgpack import remote
from imgpack.errors import FormatError, ImgpackError, InvalidArgumentError, SourceError
from imgpack.format.index import PackIndex, parse_sections, read_index
from imgpack.format.layout import HEADER_BYTES
from imgpack.remote import cache
from imgpack.remote.cache import BlockCache, folder_lock, parse_limit
from imgpack.remote.store import Store
from imgpack.shards import read_manifest
from imgpack.validate import json_or_none

__all__ = ["open_remote", "RemotePacks", "Ahead", "published", "staged", "Staging"]

BATCHES_AHEAD = 4  # batches fetched beyond the one handed over last
IN_FLIGHT = 4  # ranged requests under way at once
_WAKE_S = 0.05  # how often a prefetch that is far enough ahead looks at the loop again


def open_remote(
    source: Any, *, cache_dir: Any, cache_limit: Any, storage_options: Any
) -> tuple[Any, RemotePacks]:
    """(the local source to open instead of ``source``, its ``RemotePacks``)."""
    if not remote.has_url(source):
        raise InvalidArgumentError(
            "cache_dir, cache_limit and storage_options are for a pack at a URL; "
            f"{source!r} is a local path"
        )
    many = isinstance(source, (list, tuple))
    if many and not all(remote.has_url(s) for s in source):
        raise InvalidArgumentError("a list of packs is all URLs or all local paths, not both")
    limit = parse_limit(cache_limit)
    # by default per user, kept across runs: $XDG_CACHE_HOME/imgpack or ~/.cache/imgpack
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = Path(cache_dir if cache_dir is not None else Path(home) / "imgpack").expanduser()
    root.mkdir(parents=True, exist_ok=True)
    stores = [Store(u, storage_options) for u in (source if many else [source])]
    if not many and source.endswith(".json") and b'"imgpack-manifest"' in stores[0].whole(4096):
        return _open_manifest(stores[0], root, limit)
    opened = [_open_pack(store, root, limit) for store in stores]
    paths = [str(path) for path, _ in opened]
    return (paths if many else paths[0]), RemotePacks([c for _, c in opened], limit)


def _open_manifest(store: Store, root: Path, limit: int | None) -> tuple[str, RemotePacks]:
    # a folder of its own per URL, the copy under the URL's file name: what errors name
    folder = root / "manifests" / hashlib.sha256(store.url.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    name = folder / posixpath.basename(store.url)
    _replace(name, store.whole())
    raw = read_manifest(name)  # checked as a local one is: its fields, relative paths
    caches = []
    for entry in raw["shards"]:
        path, block_cache = _open_pack(store.with_name(entry["path"]), root, limit)
        entry["path"] = os.path.relpath(path.with_suffix(".bin"), folder)
        caches.append(block_cache)
    _replace(name, json.dumps(raw).encode())  # its shards: their cache folders
    return str(name), RemotePacks(caches, limit)


def _replace(path: Path, data: bytes) -> None:
    """``path`` holds ``data``, whole: processes opening the same URL may race."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _open_pack(store: Store, root: Path, limit: int | None) -> tuple[Path, BlockCache]:
    """Fetch one pack's index and metadata into its cache folder (once per identity)."""
    name = posixpath.basename(store.url).rsplit(".", 1)[0]
    bin_store = store.with_name(name + ".bin") if store.url.endswith(".json") else store
    index_bytes = store.with_name(name + ".json").whole()
    size, version = bin_store.identity()
    ident = f"{bin_store.url}\0{size}\0{version}\0{hashlib.sha256(index_bytes).hexdigest()}"
    folder = root / hashlib.sha256(ident.encode()).hexdigest()[:32]
    with folder_lock(root):
        if not (folder / "bounds").exists():
            _fill(folder, name, index_bytes, bin_store, size, limit)
    return folder / (name + ".json"), BlockCache(folder, bin_store, limit, (size, version))


def _fill(folder: Path, name: str, index_bytes: bytes, store: Store, size: int, limit) -> None:
    """Make a pack folder: the index, the sparse .bin with its metadata, the block table;
    in a temporary folder, renamed into place once whole."""
    try:
        pixels = parse_sections(json.loads(index_bytes), name + ".json")["pixels"]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise FormatError(f"{store.url}: the index beside it is no imgpack index") from None
    end = pixels.offset + pixels.nbytes
    if not HEADER_BYTES <= pixels.offset <= end <= size:
        raise FormatError(f"{store.url}: {size} bytes, the index says more ({pixels})")
    least = HEADER_BYTES + size - end + 16 * cache.MIN_BLOCK_BYTES
    if limit is not None and least > limit:
        raise InvalidArgumentError(
            f"{store.url}: cache_limit {limit} bytes is too small; this pack needs at least "
            f"{least} (its metadata and 16 blocks)"
        )
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".tmp-"))
    try:
        (tmp / (name + ".json")).write_bytes(index_bytes)
        with open(tmp / (name + ".bin"), "wb") as f:
            f.truncate(size)
            f.write(store.read(0, HEADER_BYTES, "its header"))
            f.seek(end)
            f.write(store.read(end, size, "its metadata"))
        cache.lay_out(tmp, read_index(tmp / (name + ".json")), limit)  # validated as a local pack
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class RemotePacks:
    """The block caches of a dataset's packs, in dataset order, and the bound on their folder."""

    def __init__(self, caches: Sequence[BlockCache], limit: int | None) -> None:
        self.caches, self.limit = list(caches), limit
        # the bytes of records a read may pin at once, all its threads together: with the
        # prefetch's blocks they fit the least limit ``_fill`` accepts (16 blocks of
        # ``limit / 64`` at least), so a loader's batch larger than that is read in parts
        self.pin_bytes = None if limit is None else limit // 8

    def attach(self, indexes: Sequence[PackIndex]) -> None:
        """Give each cache its pack's record offsets and CRC-32s (again in each process)."""
        for c, ix in zip(self.caches, indexes):
            c.offsets = ix.data_offset + ix.record_offsets
            c.crcs = ix.read_section("checksums")

    def own(self, rec: np.ndarray) -> np.ndarray:
        """A sample's pixels, copied where they view the cache under a limit: its block may
        be evicted once the read ends, and a view of it would then show zeros. Without a
        limit nothing is ever evicted, and a sample stays a view of the mapping."""
        return rec.copy() if self.limit is not None and rec.base is not None else rec

    def order(self, order: Any) -> Any:
        """The loader's order for these packs: blocks as long as the cache's and windows of
        a quarter of the limit; the default "uniform" becomes "block" where the packs'
        records exceed the limit."""
        from imgpack.reader.options import OrderOptions

        total = sum(int(c.here.sizes.sum()) for c in self.caches)
        if order == "uniform" and self.limit is not None and total > self.limit:
            order = "block"
        if order != "block":
            return order
        first = self.caches[0].here  # its first block: records and bytes (1 for no records)
        records, block = (first.first_record[1], first.sizes[0]) if len(first.sizes) else (1, 1)
        window = None if self.limit is None else max(1, self.limit // 4 // max(1, int(block)))
        return OrderOptions("block", block=int(records), window=window)

    def _split(self, starts: np.ndarray, idx: np.ndarray) -> Iterator[tuple[BlockCache, Any]]:
        """(cache, its records) per pack of the global records ``idx``, in order of first
        appearance."""
        pack = np.searchsorted(starts, idx, side="right") - 1
        for p in dict.fromkeys(pack.tolist()):
            yield self.caches[p], idx[pack == p] - starts[p]

    def reading(self, starts: np.ndarray, idx: Any) -> contextlib.ExitStack:
        """A context in which the blocks of global records ``idx`` (in range) are present
        and pinned (``BlockCache.reading``)."""
        with contextlib.ExitStack() as stack:  # unwound here only where a fetch fails
            for c, records in self._split(starts, np.atleast_1d(np.asarray(idx, np.int64))):
                stack.enter_context(c.reading(records))
            return stack.pop_all()

    def stored(self, starts: np.ndarray, first: int, stop: int, read: Callable) -> Iterator:
        """``read(a, b)``'s views of records first..stop-1, one block at a time, each block
        fetched as the run reaches it (a resident loader copies a pack beyond the limit)."""
        bounds = [c.here.first_record + start for c, start in zip(self.caches, starts)]
        cuts = np.unique(np.clip(np.concatenate([[first, stop], *bounds]), first, stop)).tolist()
        for a, b in zip(cuts[:-1], cuts[1:]):
            with self.reading(starts, np.arange(a, b)):
                yield from read(a, b)

    def ahead(self, starts: np.ndarray, batches: Iterator[np.ndarray], done: Callable[[], int]):
        """A prefetch of ``batches`` (global records), started now; ``close()`` it."""

        def blocks(idx: np.ndarray) -> list[tuple[BlockCache, int]]:
            return [(c, b) for c, r in self._split(starts, idx) for b in c.blocks_of(r)]

        return Ahead(blocks, lambda key: key[0].take(key[1], hold=False), batches, done)


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
        from imgpack.reader import run  # the loader's (with torch): not for the packer's use

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
        from imgpack.reader import run

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


class Staging(contextlib.AbstractContextManager):
    """What a command packs in place of its URLs: ``target``, the local output, in
    ``folder`` (None: no URL, nothing to stage). As a context around the packing, an error
    that names a fetched copy names the URL the user gave instead."""

    def __init__(self, out: str, folder: Path | None, own: bool, say: Callable[[str], None]):
        self.out, self.folder, self.own, self.say = out, folder, own, say
        self.target = folder / out.rsplit("/", 1)[-1] if remote.has_url(out) else Path(out)
        self.copies: dict[str, str] = {}  # a fetched source's local path -> its URL

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        if isinstance(error, ImgpackError):
            said = str(error)
            # a source's name in the pack is its path from the sources' common folder
            # (where every source is a URL's, as select.resolve_sources names them)
            root = os.path.commonpath([os.path.dirname(p) for p in self.copies] or ["/"])
            for local, url in self.copies.items():
                said = said.replace(local, url)
                name = re.escape(Path(os.path.relpath(local, root)).as_posix())
                said = re.sub(rf"(?<![^\s'\"(]){name}(?=[:\s'\")]|$)", lambda _, u=url: u, said)
            if said != str(error):
                raise type(error)(said).with_traceback(tb) from None  # where it arose

    def fetch(self, url: str) -> list[Path]:
        """Tar shards or Parquet files at ``url`` (a glob or brace range) -> local copies in
        the folder's ``sources``."""
        from imgpack.packer.sources.select import expand_braces

        fetched = []
        for one in expand_braces(url):
            store = Store(one)
            fs, path = store.filesystem()
            names = sorted(fs.glob(path)) if any(c in path for c in "*?[") else [path]
            if not names:  # as a local pattern says it
                raise SourceError(f"{one}: no file matches this pattern")
            for name in names:
                copy = store.with_name(posixpath.relpath(name, posixpath.dirname(path)))
                local = self._local(copy.url)
                if str(local) not in self.copies:  # a file two patterns name: fetched once
                    # a rerun fetches again only what changed at the URL (``Store.download``)
                    copy.download(local)
                    self.copies[str(local)] = copy.url
                fetched.append(local)
        self.say(f"fetched {len(fetched)} source file(s) from {url}")
        return fetched

    def _local(self, url: str) -> Path:
        """Where the copy of ``url`` goes: below ``sources``, at the URL's host and path
        (``s3://b/a/x.tar`` -> ``sources/b/a/x.tar``), so that no copy replaces another
        (``a/x.tar``, ``c/x.tar``), a rerun finds each where it was, and the samples are
        named and ordered as the same files in local folders would be."""
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        host += "" if parts.port is None else f"_{parts.port}"
        local = self.folder / "sources" / host / parts.path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        return local

    def publish(self, upload: bool = True) -> None:
        """Once packed: upload the pack where the output is a URL (``upload=False``: it is
        there already), then remove the command's own folder."""
        try:
            if upload and remote.has_url(self.out):
                for ext in (".bin", ".json"):  # the data first, the index last
                    Store(self.out.rsplit(".", 1)[0] + ext).write(self.target.with_suffix(ext))
                self.say(
                    f"uploaded {self.target.stem}.bin and .json to {self.out.rsplit('/', 1)[0]}/"
                )
        finally:
            if self.own:  # a failed run keeps it: the same command continues there
                shutil.rmtree(self.folder, ignore_errors=True)


def staged(
    src: Sequence[str], out: str, work: Path | None, say: Callable[[str], None]
) -> tuple[list[Path], Path, Staging]:
    """(local sources, local output, their ``Staging``) for ``src`` and ``out``, either of
    which may be URLs; without ``work`` the folder is the command's own, named after it."""
    if not remote.has_url([out, *src]):
        return [Path(s) for s in src], Path(out), Staging(out, None, False, say)
    # without ``work``, one folder per command: its rerun continues what a failure left
    key = hashlib.sha256("\0".join([out, *src]).encode("utf-8", "surrogateescape")).hexdigest()
    folder = Path(work) if work is not None else Path(tempfile.gettempdir()) / f"imgpack-{key[:16]}"
    folder.mkdir(parents=True, exist_ok=True)
    staging = Staging(out, folder, work is None, say)
    # a source given twice is packed once, as resolve_sources takes a local one
    src = list(dict.fromkeys(src))
    sources = [p for s in src for p in (staging.fetch(s) if remote.has_url(s) else [Path(s)])]
    return sources, staging.target, staging


def published(out: str) -> dict | None:
    """The index of the pack already at the URL ``out`` (its ``.json``), None if there is
    none: what a rerun of the command that published it compares itself with."""
    index = Store(out.rsplit(".", 1)[0] + ".json")
    if index.info(missing_ok=True) is None:
        return None
    found = json_or_none(index.whole())  # retried and checked, its errors one line
    if not isinstance(found, dict):
        raise remote.RemoteError(f"{index.url}: already exists and is no imgpack index")
    return found
