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

import contextlib
import hashlib
import os
import posixpath
import re
import shutil
import tempfile
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from imgpack.errors import ImgpackError, SourceError
from imgpack.remote import RemoteError, has_url
from imgpack.remote.store import Store
from imgpack.validate import json_or_none

__all__ = ["published", "staged", "Staging"]


class Staging(contextlib.AbstractContextManager):
    """What a command packs in place of its URLs: ``target``, the local output, in
    ``folder`` (None: no URL, nothing to stage). As a context around the packing, an error
    that names a fetched copy names the URL the user gave instead."""

    def __init__(self, out: str, folder: Path | None, own: bool, say: Callable[[str], None]):
        self.out, self.folder, self.own, self.say = out, folder, own, say
        self.target = folder / out.rsplit("/", 1)[-1] if has_url(out) else Path(out)
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
            if upload and has_url(self.out):
                for suffix in (".bin", ".json"):  # the data first, the index last
                    local = self.target.with_suffix(suffix)
                    Store(self.out.rsplit(".", 1)[0] + suffix).write(local)
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
    if not has_url([out, *src]):
        return [Path(s) for s in src], Path(out), Staging(out, None, False, say)
    if work is None:  # one folder per command: its rerun continues what a failure left
        key = hashlib.sha256("\0".join([out, *src]).encode("utf-8", "surrogateescape"))
        folder = Path(tempfile.gettempdir()) / f"imgpack-{key.hexdigest()[:16]}"
    else:
        folder = Path(work)
    folder.mkdir(parents=True, exist_ok=True)
    staging = Staging(out, folder, work is None, say)
    # a source given twice is packed once, as resolve_sources takes a local one
    src = list(dict.fromkeys(src))
    sources = [p for s in src for p in (staging.fetch(s) if has_url(s) else [Path(s)])]
    return sources, staging.target, staging


def published(out: str) -> dict | None:
    """The index of the pack already at the URL ``out`` (its ``.json``), None if there is
    none: what a rerun of the command that published it compares itself with."""
    index = Store(out.rsplit(".", 1)[0] + ".json")
    if index.info(missing_ok=True) is None:
        return None
    found = json_or_none(index.whole())  # retried and checked, its errors one line
    if not isinstance(found, dict):
        raise RemoteError(f"{index.url}: already exists and is no imgpack index")
    return found
