"""Fixtures of the remote tests (imported by each test module: a conftest.py here would
shadow tests/conftest.py, which tests import by name): real protocol servers on 127.0.0.1
(moto's S3; an HTTP server over a folder that honours Range requests, with faults a test
can switch on), small blocks so that tiny packs span many, and a count of ranged reads."""

from __future__ import annotations

import email.utils
import hashlib
import http.server as httpserver
import itertools
import logging
import os
import re
import threading
from pathlib import Path

import pytest

if os.environ.get("IMGPACK_CI"):  # .ci/run: the dev extra installed them, so no skip
    import moto  # noqa: F401
    import s3fs  # noqa: F401
pytest.importorskip("s3fs", reason="the remote extra: pip install imgpack[remote]")
pytest.importorskip("moto", reason="the dev extra runs an S3 server: moto[server]")

_buckets = itertools.count()


class RangeServer:
    """Serves ``root`` over HTTP with Range requests; counts them per path in ``ranges``.

    ``fault``: None, "corrupt" (one flipped byte), "short" (half the bytes) for the next
    ``faults`` ranged GETs, or "down" for every request (a 503). ``dated``: send the
    files' Last-Modified, as most servers do (this one does not by default)."""

    def __init__(self, root: Path) -> None:
        self.root, self.ranges, self.fault, self.faults = Path(root), [], None, 0
        self.dated = False
        server = self

        class Handler(httpserver.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _file(self):
                path = server.root / self.path.lstrip("/")
                return path if path.is_file() else None

            def _head(self, path, status, length, extra=()):
                self.send_response(status)
                st = path.stat()
                etag = hashlib.md5(f"{st.st_size}-{st.st_mtime_ns}".encode()).hexdigest()
                self.send_header("ETag", f'"{etag}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(length))
                if server.dated:
                    self.send_header(
                        "Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True)
                    )
                for k, v in extra:
                    self.send_header(k, v)
                self.end_headers()

            def do_HEAD(self):
                path = self._file()
                if server.fault == "down" or path is None:
                    return self.send_error(503 if path else 404)
                self._head(path, 200, path.stat().st_size)

            def do_GET(self):
                path = self._file()
                if server.fault == "down" or path is None:
                    return self.send_error(503 if path else 404)
                data = path.read_bytes()
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                if m is None:
                    self._head(path, 200, len(data))
                    return self.wfile.write(data)
                a = int(m[1])
                b = min(int(m[2]) + 1 if m[2] else len(data), len(data))
                part = data[a:b]
                server.ranges.append((self.path, a, b))
                if server.faults > 0 and server.fault in ("corrupt", "short"):
                    server.faults -= 1
                    if server.fault == "corrupt" and part:
                        part = bytes([part[0] ^ 0xFF]) + part[1:]
                    else:
                        part = part[: len(part) // 2]
                extra = [("Content-Range", f"bytes {a}-{b - 1}/{len(data)}")]
                self._head(path, 206, len(part), extra)
                self.wfile.write(part)

        self.httpd = httpserver.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # a 0.05 s poll: shutdown() waits for the next one (the default 0.5 s, per test)
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()


def start_s3():
    """moto's S3 server on a free port of 127.0.0.1; the AWS_* variables point at it."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    return server


@pytest.fixture(scope="session")
def s3_server():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = start_s3()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_fs(s3_server):
    """One client of the S3 server for the tests' own uploads (a client's setup is slow)."""
    import fsspec

    return fsspec.filesystem("s3", skip_instance_cache=True)


@pytest.fixture
def s3(s3_fs):
    """put(local file, name) -> its s3:// URL in a fresh bucket."""
    fs = s3_fs
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
