"""URLs -> local packs in the cache folder, which the dataset then opens as local ones.

``open_remote`` fetches each pack's index and the metadata of its .bin (header, labels,
checksums, paths, record fields: everything but the records) into a sparse cache file of
the pack's full size, so that ``read_index`` validates it as it validates a local pack;
a manifest at a URL is copied beside them with its shards pointing at their cache
folders. ``RemotePacks`` is what the dataset keeps: the packs' block caches, asked to
``reading`` the records a read is about to touch (fetched, and pinned while it runs), and
a prefetcher per pass.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Callable

import numpy as np

from imgpack import remote
from imgpack.errors import FormatError, InvalidArgumentError
from imgpack.format.index import PackIndex, parse_sections, read_index
from imgpack.format.layout import HEADER_BYTES
from imgpack.remote import cache
from imgpack.remote.cache import BlockCache, folder_lock, parse_limit
from imgpack.remote.store import Store
from imgpack.shards import read_manifest

__all__ = ["open_remote", "RemotePacks"]


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
        stack = contextlib.ExitStack()
        with stack:  # unwound here only where a fetch fails
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
        from imgpack.remote.ahead import Ahead

        def blocks(idx: np.ndarray) -> list[tuple[BlockCache, int]]:
            return [(c, b) for c, r in self._split(starts, idx) for b in c.blocks_of(r)]

        return Ahead(blocks, lambda key: key[0].take(key[1], hold=False), batches, done)
