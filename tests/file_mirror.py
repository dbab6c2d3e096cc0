"""A local HTTP mirror for the fetch tests: files served on 127.0.0.1 by URL path (`mempipe data fetch`
with `base_url_override` set to its `url`), so nothing reaches the network. The `mirror` fixture
(tests/conftest.py) starts one per test."""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class Mirror:
    """Files served on 127.0.0.1 by URL path; counts the GET requests per path and logs each one's
    Range header and the body bytes it sent. `Range: bytes=N-` is honoured (206) unless `ranges` is
    off (then 200, the whole file); `cut[path] = n` sends the first request for `path` only n bytes of
    its body, with the whole file's Content-Length, and closes the connection."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: Counter[str] = Counter()
        self.log: list[tuple[str, str | None, int]] = []  # (path, Range header, body bytes sent)
        self.cut: dict[str, int] = {}
        self.ranges = True
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = urlsplit(self.path).path
                mirror.requests[path] += 1
                body = mirror.files.get(path)
                asked = self.headers.get("Range")
                if body is None:
                    mirror.log.append((path, asked, 0))
                    self.send_error(404)
                    return
                start = int(asked.removeprefix("bytes=").split("-")[0]) if asked and mirror.ranges else 0
                if start >= len(body) and start:
                    mirror.log.append((path, asked, 0))
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(body)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                payload = body[start:][: mirror.cut.pop(path, None)]  # a cut: the first n bytes, then close
                # Logged before the body goes out: the client may return (and the test read the log)
                # as soon as the last byte arrives, before this thread would run another line.
                mirror.log.append((path, asked, len(payload)))
                self.wfile.write(payload)
                self.wfile.flush()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def serve(self, url: str, body: bytes) -> None:
        """Serve `body` where the mirror keeps `url` (its path)."""
        self.files[urlsplit(url).path] = body

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
