"""Real `dbqueue server` processes for the tests, and a raw client to talk its protocol.

The server is started on a free port (``--port 0``) unless a port is given (a restart reuses
its predecessor's), and the test learns the port from the server's own "listening on" line.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dbqueue.lockserver import protocol

DBQUEUE = str(Path(sys.executable).parent / "dbqueue")
LISTENING = re.compile(r"listening on (\S+?):(\d+)")


@dataclass
class ServerProcess:
    process: subprocess.Popen
    host: str
    port: int
    log: Path
    token: str | None = None
    _closed: bool = field(default=False, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def kill(self) -> None:
        """SIGKILL, as a crash would: no goodbye to the clients."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(30)

    def stats(self) -> dict[str, Any]:
        with RawClient(self.host, self.port) as client:
            client.hello(token=self.token)
            return client.request({"op": "stats", "id": 1})

    def tail(self) -> str:
        return self.log.read_text()[-4000:] if self.log.exists() else "(no log)"


def start_server(
    url: str,
    prefix: str,
    log: Path,
    *,
    port: int = 0,
    token: str | None = None,
    extra: tuple[str, ...] = (),
    timeout: float = 60,
) -> ServerProcess:
    """Start `dbqueue server` on ``url``'s tables and wait until it listens."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DBQUEUE_", "DB_"))}
    if token is not None:
        env["DBQUEUE_LOCK_SERVER_TOKEN"] = token
    start = log.stat().st_size if log.exists() else 0
    process = subprocess.Popen(
        [
            DBQUEUE,
            "server",
            "--url",
            url,
            "--table-prefix",
            prefix,
            "--port",
            str(port),
            "--notify-port",
            str(port),
            "--check-tasks-interval",
            "1",
            *extra,
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = LISTENING.search(log.read_text()[start:]) if log.exists() else None
        if found:
            return ServerProcess(process, found.group(1), int(found.group(2)), log, token)
        if process.poll() is not None:
            raise AssertionError(
                f"dbqueue server exited with {process.returncode}:\n" + log.read_text()[start:]
            )
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"dbqueue server did not start within {timeout}s:\n{log.read_text()}")


class RawClient:
    """A bare socket speaking the protocol, to send the server exactly what a test wants."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout)
        self.sock.settimeout(timeout)

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(protocol.encode(message))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self) -> dict[str, Any]:
        header = self._exactly(protocol.HEADER.size)
        return protocol.decode(self._exactly(protocol.frame_length(header)))

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        self.send(message)
        while True:
            reply = self.receive()
            if reply.get("id") == message.get("id"):
                return reply

    def hello(self, token: str | None = None, version: int = protocol.VERSION) -> dict[str, Any]:
        message: dict[str, Any] = {
            "op": "hello",
            "protocol": protocol.PROTOCOL,
            "version": version,
            "client": "test",
        }
        if token is not None:
            message["token"] = token
        self.send(message)
        return self.receive()

    def closed_by_server(self, timeout: float) -> bool:
        """True once the server has closed this connection (EOF or reset) within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def _exactly(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            data += chunk
        return bytes(data)
