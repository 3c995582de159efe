"""A real HTTP server on 127.0.0.1 for the webhook tests: it records every request it gets.

Endpoints: ``/ok`` answers 200; ``/fail`` answers 500 with a long body that echoes the request's
Authorization header (to show it is scrubbed); ``/slow`` answers only after the test ends (or
3 s), so a short webhook timeout expires first; ``/huge`` answers 200 with 5 MB; ``/redirect``
answers 302 to ``/ok``. ``closed_port()`` gives a port nothing listens on. A test adds its own
endpoints to ``routes``: path → function of the Recorded request → (status, body).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

SLOW_SECONDS = 3.0
HUGE_BYTES = 5 * 1024 * 1024


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes


class RecordingServer:
    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.release = threading.Event()  # set at the end: slow answers stop waiting
        self.routes: dict[str, Callable[[Recorded], tuple[int, bytes]]] = {}
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._handle()

            def do_POST(self) -> None:  # noqa: N802
                self._handle()

            def do_PUT(self) -> None:  # noqa: N802
                self._handle()

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                recorded = Recorded(
                    method=self.command,
                    path=parts.path,
                    query=parse_qs(parts.query, keep_blank_values=True),
                    headers=dict(self.headers.items()),
                    body=body,
                )
                server._record(recorded)
                route = server.routes.get(parts.path)
                # The client may stop reading first (its timeout, or its response cap).
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    if route is not None:
                        self._send(*route(recorded))
                    else:
                        self._answer(parts.path)

            def _answer(self, path: str) -> None:
                if path == "/ok":
                    self._send(200, b"accepted")
                elif path == "/fail":
                    echoed = self.headers.get("Authorization", "")
                    self._send(500, f"boom: you sent {echoed}; ".encode() + b"x" * 20_000)
                elif path == "/slow":
                    server.release.wait(SLOW_SECONDS)
                    self._send(200, b"too late")
                elif path == "/huge":
                    self.send_response(200)
                    self.send_header("Content-Length", str(HUGE_BYTES))
                    self.end_headers()
                    chunk = b"y" * 65536
                    for _ in range(HUGE_BYTES // len(chunk)):
                        self.wfile.write(chunk)
                elif path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", "/ok")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._send(404, b"no such endpoint")

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # keep the test output clean

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def _record(self, request: Recorded) -> None:
        with self._lock:
            self.requests.append(request)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def received(self, path: str) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.path == path]

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port() -> int:
    """A local port with nothing listening (bound for a moment by us, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
