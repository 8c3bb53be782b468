"""Fixtures of the remote tests: packs served by real local servers (moto's S3, a Range
HTTP server), small blocks so that tiny packs span many, and a count of ranged reads."""

from __future__ import annotations

import itertools
import logging
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from servers import RangeServer, start_s3  # noqa: E402

if os.environ.get("IMGPACK_CI"):  # .ci/run: the dev extra installed them, so no skip
    import moto  # noqa: F401
    import s3fs  # noqa: F401
pytest.importorskip("s3fs", reason="the remote extra: pip install imgpack[remote]")
pytest.importorskip("moto", reason="the dev extra runs an S3 server: moto[server]")

_buckets = itertools.count()


@pytest.fixture(scope="session")
def s3_server():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = start_s3()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server):
    """put(local file, name) -> its s3:// URL in a fresh bucket."""
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    bucket = f"bkt{next(_buckets)}"
    fs.mkdir(bucket)

    def put(local: Path, name: str | None = None) -> str:
        fs.put_file(str(local), f"{bucket}/{name or Path(local).name}")
        return f"s3://{bucket}/{name or Path(local).name}"

    put.fs, put.bucket = fs, bucket
    return put


@pytest.fixture
def http(tmp_path):
    server = RangeServer(tmp_path)
    yield server
    server.close()


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Blocks of about 3 records of the 64x64 test packs (12 KiB each)."""
    from imgpack.remote import cache

    monkeypatch.setattr(cache, "BLOCK_BYTES", 36 << 10)


@pytest.fixture
def reads(monkeypatch):
    """The (start, end) of every ranged read of a pack's records, in this process."""
    from imgpack.remote.store import Store

    seen: list[tuple[int, int]] = []
    original = Store.read

    def read(self, start, end, what, check=None):
        if what.startswith("records"):
            seen.append((start, end))
        return original(self, start, end, what, check)

    monkeypatch.setattr(Store, "read", read)
    return seen
