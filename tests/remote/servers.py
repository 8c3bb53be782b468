"""Real protocol servers on 127.0.0.1 for the remote tests: moto's S3 and a Range-honouring
HTTP server over a folder (whose faults a test can switch on: corrupt, short, refuse)."""

from __future__ import annotations

import hashlib
import http.server
import os
import re
import threading
from pathlib import Path

__all__ = ["RangeServer", "start_s3"]


class RangeServer:
    """Serves ``root`` over HTTP with Range requests; counts them per path in ``ranges``.

    ``fault``: None, "corrupt" (one flipped byte), "short" (half the bytes) for the next
    ``faults`` ranged GETs, or "down" for every request (a 503)."""

    def __init__(self, root: Path) -> None:
        self.root, self.ranges, self.fault, self.faults = Path(root), [], None, 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
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

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
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
