"""``pack-images SRC... s3://bucket/train.bin``: pack here, then publish at the URL.

The pack is written in a local folder (``--work DIR``, kept so that a rerun continues
it, or a temporary one), then uploaded data file first and index last: a reader opens a
pack by its index, so it never sees half a pack. Tar shards and Parquet files named by
URL (globs and brace ranges too) are fetched into that folder first.
"""

from __future__ import annotations

import posixpath
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Callable

from imgpack.errors import SourceError
from imgpack.remote import has_url
from imgpack.remote.store import Store

__all__ = ["staged"]


def staged(
    src: Sequence[str], out: str, work: Path | None, say: Callable[[str], None]
) -> tuple[list[Path], Path, Callable[[], None] | None]:
    """(local sources, local output, what to run once packed, or None) for ``src`` and
    ``out``, either of which may be URLs: once packed, the pack is uploaded where ``out``
    is a URL, and a temporary folder (no ``work``) is removed."""
    if not has_url([out, *src]):
        return [Path(s) for s in src], Path(out), None
    folder = Path(work) if work is not None else Path(tempfile.mkdtemp(prefix="imgpack-"))
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / out.rsplit("/", 1)[-1] if has_url(out) else Path(out)

    def publish() -> None:
        try:
            if has_url(out):
                for suffix in (".bin", ".json"):  # the data first, the index last
                    Store(out.rsplit(".", 1)[0] + suffix).write(target.with_suffix(suffix))
                say(f"uploaded {target.stem}.bin and .json to {out.rsplit('/', 1)[0]}/")
        finally:
            remove()

    # a temporary folder goes once packed, and also when the run fails: no rerun can find
    # it again, so its fetched copies would only fill the disk; a run that fails
    # later drops ``publish`` uncalled (or exits), and the folder goes then
    remove = weakref.finalize(publish, shutil.rmtree, folder, ignore_errors=True)
    if work is not None:
        remove.detach()
    try:
        sources = [Path(p) for s in src for p in (_fetched(s, folder, say) if has_url(s) else [s])]
    except BaseException:
        remove()
        raise
    return sources, target, publish


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
            if not target.exists():  # a rerun with --work fetches nothing again
                store.with_name(posixpath.relpath(name, posixpath.dirname(path))).download(target)
            out.append(target)
    say(f"fetched {len(out)} source file(s) from {url}")
    return out
