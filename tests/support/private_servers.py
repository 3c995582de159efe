"""Throwaway PostgreSQL and MariaDB servers that a test may crash and restart.

The shared servers on 5432/3306 serve other test suites at the same time, so a test that restarts
a database starts its own: a fresh data directory, a free port on 127.0.0.1, its own socket.
Start-up is tuned for speed where that changes nothing the tests prove (small buffers, no sync of
the freshly created data directory), never for durability: fsync stays on, and MariaDB flushes
its redo log at every commit, so a crash restart keeps exactly what was committed, as in
production.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa


class ServerUnavailable(Exception):
    """This machine cannot run a private server (binaries missing, start-up failed)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_connectable(url: str, timeout: float, log: Path) -> None:
    engine = sa.create_engine(url, connect_args={"connect_timeout": 2}, poolclass=sa.NullPool)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                with engine.connect() as conn:
                    conn.execute(sa.text("SELECT 1"))
                return
            except sa.exc.OperationalError as exc:
                if time.monotonic() > deadline:
                    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                    raise ServerUnavailable(f"{url} did not come up: {exc.orig}\n{tail}") from None
                time.sleep(0.1)
    finally:
        engine.dispose()


def _as_user(user: str) -> list[str]:
    """PostgreSQL refuses to run as root, MariaDB wants --user: drop to their own user."""
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser")
    if runuser is None:
        raise ServerUnavailable("running as root without runuser")
    return [runuser, "-u", user, "--"]


def _owned_tempdir(prefix: str, user: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        shutil.chown(path, user, user)
    return path


def _run(args: list[str], what: str) -> None:
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise ServerUnavailable(f"{what} failed ({result.returncode}): {result.stderr[-2000:]}")


class PrivatePostgres:
    """initdb + pg_ctl on a free port; ``crash()`` is ``pg_ctl stop -m immediate``."""

    name = "PostgreSQL"

    def __init__(self) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found:
            raise ServerUnavailable("no PostgreSQL server binaries under /usr/lib/postgresql")
        self.bin = Path(found[-1]).parent
        self.port = free_port()
        self.dir = _owned_tempdir("dbqueue-chaos-pg-", "postgres")
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.url = f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/test"
        self.as_postgres = _as_user("postgres")
        _run(
            [
                *self.as_postgres,
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",  # only the creation is not synced; the server runs with fsync on
                "--no-instructions",
            ],
            "initdb",
        )
        self.start()
        admin = sa.create_engine(
            f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres",
            isolation_level="AUTOCOMMIT",
            poolclass=sa.NullPool,
        )
        with admin.connect() as conn:
            conn.execute(sa.text("CREATE DATABASE test"))
        admin.dispose()

    def _pg_ctl(self, *args: str) -> None:
        _run([*self.as_postgres, str(self.bin / "pg_ctl"), "-D", str(self.data), *args], "pg_ctl")

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
            "-c shared_buffers=16MB -c max_connections=80 -c fsync=on"
        )
        self._pg_ctl("-l", str(self.log), "-w", "-t", "60", "-o", options, "start")
        _wait_until_connectable(self.url.replace("/test", "/postgres"), 60, self.log)

    def crash(self) -> None:
        """Stop at once, as a crash would: no checkpoint, clients cut off."""
        self._pg_ctl("-m", "immediate", "-w", "stop")

    def restart(self) -> None:
        self.crash()
        self.start()

    def destroy(self) -> None:
        with contextlib.suppress(ServerUnavailable):  # not running
            self._pg_ctl("-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateMariaDB:
    """mariadb-install-db + mariadbd on a free port; ``crash()`` is SIGKILL."""

    name = "MariaDB"

    def __init__(self) -> None:
        self.server = shutil.which("mariadbd") or (
            "/usr/sbin/mariadbd" if os.path.exists("/usr/sbin/mariadbd") else None
        )
        install = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
        if self.server is None or install is None:
            raise ServerUnavailable("no mariadbd / mariadb-install-db on this machine")
        self.port = free_port()
        self.dir = _owned_tempdir("dbqueue-chaos-my-", "mysql")
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.url = f"mysql+pymysql://root@127.0.0.1:{self.port}/test"
        self.process: subprocess.Popen | None = None
        user = ["--user=mysql"] if os.geteuid() == 0 else []
        _run(
            [
                install,
                "--no-defaults",
                *user,
                f"--datadir={self.data}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
            ],
            "mariadb-install-db",
        )
        self.start()
        admin = sa.create_engine(self.url.replace("/test", "/"), poolclass=sa.NullPool)
        with admin.connect() as conn:
            conn.execute(sa.text("CREATE DATABASE IF NOT EXISTS test"))
        admin.dispose()

    def start(self) -> None:
        assert self.server is not None
        user = ["--user=mysql"] if os.geteuid() == 0 else []
        self.process = subprocess.Popen(
            [
                self.server,
                "--no-defaults",
                *user,
                f"--datadir={self.data}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self.dir / 'mysqld.sock'}",
                f"--pid-file={self.dir / 'mysqld.pid'}",
                f"--log-error={self.log}",
                "--skip-name-resolve",
                "--skip-log-bin",
                "--performance-schema=OFF",
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=16M",
                "--innodb-flush-log-at-trx-commit=1",  # durable commits, as in production
                "--max-connections=200",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_until_connectable(self.url.replace("/test", "/"), 60, self.log)

    def crash(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)
            self.process = None

    def restart(self) -> None:
        self.crash()
        self.start()

    def destroy(self) -> None:
        self.crash()
        shutil.rmtree(self.dir, ignore_errors=True)


PRIVATE_SERVERS = {"postgresql": PrivatePostgres, "mysql": PrivateMariaDB}


def private_server(servers: dict[str, object], database: str) -> object:
    """The private server for ``database`` from the cache ``servers`` (started on first use),
    or a string saying why none can run here."""
    if database not in servers:
        if os.environ.get("DBQUEUE_CHAOS_SHARED_SERVERS"):
            servers[database] = "DBQUEUE_CHAOS_SHARED_SERVERS is set"
        else:
            try:
                servers[database] = PRIVATE_SERVERS[database]()
            except ServerUnavailable as exc:
                servers[database] = str(exc)
    return servers[database]
