"""One object at a URL, read in ranges: the only module that imports fsspec.

Credentials and endpoints come the store's usual way (for S3, botocore reads the
``AWS_*`` variables, ``AWS_ENDPOINT_URL`` included); ``storage_options`` given to the
dataset wins over them, as in pandas. A read that fails or comes back short or damaged
is retried with back-off, then raises one ``RemoteError`` line naming the URL and what
was asked for; no read waits unbounded (each try is the filesystem's own request,
``TRIES`` of them at most).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

from imgpack.errors import InvalidArgumentError, MissingExtraError
from imgpack.remote import RemoteError

__all__ = ["Store", "TRIES", "BACKOFF_S"]

TRIES = 4  # a range is asked for at most this often
BACKOFF_S = 0.25  # then 0.5, 1.0: a restarting endpoint gets about 2 s
# where stores keep what changes when an object is replaced, first found first: a version,
# else a date (HTTP: the headers, as text), else a digest
_VERSIONS = ("ETag", "etag", "VersionId", "LastModified", "last_modified", "mtime")
_VERSIONS += ("Last-Modified", "md5")
_S3_CONFIG = {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 2}}


def _filesystem(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    try:
        from fsspec.core import url_to_fs

        return url_to_fs(url, skip_instance_cache=True, **options)
    except ImportError as e:  # fsspec, or the package of the store fsspec names
        raise MissingExtraError(
            f"{url}: {e.name or 'its filesystem'} is not installed: pip install imgpack[remote]"
            " (for S3; another store needs its fsspec package, e.g. gcsfs, adlfs)"
        ) from None
    except (ValueError, TypeError) as e:
        raise RemoteError(f"{url}: cannot open ({e})") from None


class Store:
    """One URL's filesystem, made again lazily in each process (clients do not survive
    fork), and the object's identity: size plus ETag or modification time."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        if storage_options is not None and not isinstance(storage_options, dict):
            raise InvalidArgumentError(
                f"storage_options must be a dict, not {type(storage_options).__name__}"
            )
        self.url, self.options = url, dict(storage_options or {})
        if url.startswith("s3://"):  # botocore's own waits (60 s a connection, retried) would
            # hold a read far longer than TRIES; the caller's config_kwargs win
            self.options.setdefault("config_kwargs", _S3_CONFIG)
        # a missing extra or a bad option: now, in one line
        (self._fs, self.path), self._pid = _filesystem(url, self.options), os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None, "_pid": -1}  # a client made again where used

    def filesystem(self) -> tuple[Any, str]:
        """(the filesystem, this object's path in it)."""
        if self._pid != os.getpid():
            self._fs, self._pid = _filesystem(self.url, self.options)[0], os.getpid()
        return self._fs, self.path

    def download(self, local: Path) -> None:
        """This object into the local file ``local`` (through a partial file beside it),
        dated by its version (``identity``): the packer pins a source file by its size and
        date, so a second download of the same object stays the same file, and a copy of
        the same size and date is not fetched again. A store that keeps no version (an HTTP
        server without ETag or Last-Modified): always fetched, and dated by its bytes, so
        the same bytes are still the same file to the packer and changed ones are not. One
        question to the store decides it: the object's ``info``."""
        size, version = self.identity()
        when = _date_of(hashlib.sha256(version.encode())) if version else None
        if when is not None and local.exists():
            st = local.stat()
            if (st.st_size, st.st_mtime) == (size, when):
                return
        part = Path(str(local) + ".part")
        with self._said("download failed"):
            self.filesystem()[0].get_file(self.path, str(part))
        if when is None:
            with open(part, "rb") as f:
                when = _date_of(hashlib.file_digest(f, "sha256"))
        os.utime(part, (when, when))
        part.replace(local)

    def with_name(self, name: str) -> Store:
        """The object at ``name`` relative to this one's folder (the index beside a .bin, a
        manifest's shard), through the same filesystem: one client (its setup is most of
        the cost of opening a pack) for all of them."""
        beside = Store.__new__(Store)
        beside.__dict__.update(self.__dict__, url=_beside(self.url, name))
        beside.path = _beside(self.path, name)
        return beside

    def info(self, *, missing_ok: bool = False) -> dict[str, Any] | None:
        """What the store says of the object (size, date, version); for no object, None
        where ``missing_ok``, else a "not found" error."""
        fs, path = self.filesystem()
        with self._said("cannot read"):
            try:
                return fs.info(path)
            except FileNotFoundError:
                if missing_ok:
                    return None
        raise RemoteError(f"{self.url}: not found")

    def identity(self) -> tuple[int, str]:
        """(size, version): a version string that changes when the object is replaced."""
        info = self.info()
        version = next((str(info[k]) for k in _VERSIONS if info.get(k) is not None), "")
        return int(info.get("size") or 0), version

    def whole(self, most: float = float("inf")) -> bytes:
        """The object (its first ``most`` bytes), in one checked read (``read``), after one
        question for its size."""
        size = min(most, self.identity()[0])
        return self.read(0, size, "the whole file") if size else b""

    def read(
        self, start: int, end: int, what: str, check: Callable[[bytes], str | None] | None = None
    ) -> bytes:
        """Bytes ``start``..``end`` (exclusive), ``check``-ed (it returns what is wrong, or
        None), retried with back-off; ``what`` names the range in the error."""
        fs, path = self.filesystem()
        problem = ""
        for attempt in range(TRIES):
            if attempt:
                time.sleep(BACKOFF_S * 2 ** (attempt - 1))
            try:
                data = fs.cat_file(path, start=start, end=end)
            except FileNotFoundError:
                raise RemoteError(f"{self.url}: not found (reading {what})") from None
            except Exception as e:  # noqa: BLE001 - a failed request: try again
                problem = f"{type(e).__name__}: {e}".splitlines()[0][:200]
                continue
            if len(data) > end - start:  # a range asked again is ignored again: no retry
                raise RemoteError(
                    f"{self.url}: {what}: the server returned the whole object ({len(data)} "
                    f"bytes) instead of the {end - start} asked for: it does not support Range "
                    "requests; serve the pack from one that does"
                )
            if len(data) < end - start:
                problem = f"{len(data)} bytes came, {end - start} asked for"
            elif check is None or (problem := check(data) or "") == "":
                return data
        raise RemoteError(f"{self.url}: {what}: {problem} ({TRIES} tries)")

    def write(self, local: str | os.PathLike) -> None:
        """Upload the local file ``local`` to this URL."""
        with self._said("upload failed"):
            self.filesystem()[0].put_file(os.fspath(local), self.path)

    @contextlib.contextmanager
    def _said(self, failed: str) -> Iterator[None]:
        """A client's error, whatever its kind, as one ``RemoteError`` line naming the URL."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 - any client's error, said in one line
            raise RemoteError(f"{self.url}: {failed} ({type(e).__name__}: {e})") from None


def _date_of(digest: Any) -> float:
    """A date in 1970..2106 that only the digested bytes give: their SHA-256, cut."""
    return float(int.from_bytes(digest.digest()[:4], "big"))


def _beside(url: str, name: str) -> str:
    """``name`` (a relative path) resolved against the folder of ``url`` (or of a path)."""
    scheme, sep, path = url.rpartition("://")
    return scheme + sep + posixpath.normpath(posixpath.join(posixpath.dirname(path), name))
