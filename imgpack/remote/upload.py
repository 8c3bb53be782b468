"""``pack-images SRC... s3://bucket/train.bin``: pack here, then publish at the URL.

The pack is written in a local folder (``--work DIR``, kept, or by default one under the
system's temporary folder named after the command's URLs and paths, removed once the pack
is published), then uploaded data file first and index last: a reader opens a pack by its
index, so it never sees half a pack. The default folder is the same for the same command,
so a rerun after a failure continues the pack there, as a local output's rerun does; and a
rerun after success finds the published index (``published``) and, for the same command,
nothing to do. Tar shards and Parquet files named by URL (globs and brace ranges too) are
fetched into that folder first.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Callable

from imgpack.errors import SourceError
from imgpack.remote import RemoteError, has_url
from imgpack.remote.store import Store

__all__ = ["published", "staged"]


def staged(
    src: Sequence[str], out: str, work: Path | None, say: Callable[[str], None]
) -> tuple[list[Path], Path, Callable[[], None] | None]:
    """(local sources, local output, what to run once packed, or None) for ``src`` and
    ``out``, either of which may be URLs: once packed, the pack is uploaded where ``out``
    is a URL (``upload=False``: it is there already), and the default folder (no ``work``)
    is removed."""
    if not has_url([out, *src]):
        return [Path(s) for s in src], Path(out), None
    if work is None:  # one folder per command: its rerun continues what a failure left
        key = hashlib.sha256("\0".join([out, *src]).encode("utf-8", "surrogateescape"))
        folder = Path(tempfile.gettempdir()) / f"imgpack-{key.hexdigest()[:16]}"
    else:
        folder = Path(work)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / out.rsplit("/", 1)[-1] if has_url(out) else Path(out)

    def publish(upload: bool = True) -> None:
        try:
            if upload and has_url(out):
                for suffix in (".bin", ".json"):  # the data first, the index last
                    Store(out.rsplit(".", 1)[0] + suffix).write(target.with_suffix(suffix))
                say(f"uploaded {target.stem}.bin and .json to {out.rsplit('/', 1)[0]}/")
        finally:
            if work is None:  # a failed run keeps it: the same command continues there
                shutil.rmtree(folder, ignore_errors=True)

    sources = [Path(p) for s in src for p in (_fetched(s, folder, say) if has_url(s) else [s])]
    return sources, target, publish


def published(out: str) -> dict | None:
    """The index of the pack already at the URL ``out`` (its ``.json``), None if there is
    none: what a rerun of the command that published it compares itself with."""
    index = Store(out.rsplit(".", 1)[0] + ".json")
    fs, path = index.filesystem()
    try:
        there = fs.exists(path)
    except Exception as e:  # noqa: BLE001 - any client's error, said in one line
        raise RemoteError(f"{index.url}: cannot read ({type(e).__name__}: {e})") from None
    if not there:
        return None
    try:
        found = json.loads(index.whole())  # retried and checked, its errors one line
    except (ValueError, UnicodeDecodeError):
        raise RemoteError(f"{index.url}: already exists and is no imgpack index") from None
    if not isinstance(found, dict):
        raise RemoteError(f"{index.url}: already exists and is no imgpack index")
    return found


def _fetched(url: str, work: Path, say: Callable[[str], None]) -> list[Path]:
    """Tar shards or Parquet files at ``url`` (a glob or brace range) -> local copies in
    ``work/sources``."""
    from imgpack.packer.sources.select import expand_braces

    folder = work / "sources"
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for one in expand_braces(url):
        store = Store(one)
        fs, path = store.filesystem()
        names = sorted(fs.glob(path)) if any(c in path for c in "*?[") else [path]
        if not names:  # as a local pattern says it
            raise SourceError(f"{one}: no file matches this pattern")
        for name in names:
            target = folder / name.rsplit("/", 1)[-1]
            # a rerun fetches again only what changed at the URL since (``Store.download``)
            store.with_name(posixpath.relpath(name, posixpath.dirname(path))).download(target)
            out.append(target)
    say(f"fetched {len(out)} source file(s) from {url}")
    return out
