"""The lock server's settings — the seed's variables included — and its command line.

Commands run as real processes; the queue lives in a migrated SQLite file (and, for
``--dialect singlestore``, in MariaDB through the singlestoredb driver).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.lockserver import LISTENING, start_server

import dbqueue
from dbqueue import lockserver
from dbqueue.config import Settings

DBQUEUE = str(Path(sys.executable).parent / "dbqueue")
APP_MODULE = textwrap.dedent(
    """
    import dbqueue

    app = dbqueue.App()

    @app.task("noop")
    def noop(job, session):
        return "done"
    """
)


def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout=120):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DBQUEUE_", "DB_"))}
    base["PYTHONPATH"] = str(cwd or Path.cwd())
    return subprocess.run(
        [DBQUEUE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**base, **(env or {})},
        cwd=cwd,
    )


def one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def queue(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    dbqueue.App(url).migrate()
    (tmp_path / "noop_app.py").write_text(APP_MODULE)
    return url


# ---- settings -----------------------------------------------------------------------------------
def test_client_server_mode_uses_the_seed_variables():
    env = {
        "CLIENT_SERVER_MODE": "True",
        "SERVER_HOST": "10.1.2.3",
        "LOCK_SERVICE_PORT": "9100",
        "NOTIFY_SERVICE_PORT": "9101",
        "TIMEOUT_SOCKET_MESSAGE": "2.5",
        "DBQUEUE_LOCK_SERVER_TOKEN": "t",
    }
    settings = Settings.from_env(env)
    assert settings.strategy == "lock_server"
    assert str(lockserver.lock_address(settings)) == "10.1.2.3:9100"
    assert str(lockserver.notify_address(settings)) == "10.1.2.3:9101"
    assert lockserver.message_timeout(settings) == 2.5 and settings.lock_server_token == "t"


def test_defaults_are_the_seeds_and_an_explicit_address_wins():
    defaults = Settings.from_env({})
    assert defaults.strategy is None  # the database's own (lock_server on SingleStore)
    assert str(lockserver.lock_address(defaults)) == "127.0.0.1:8970"
    assert str(lockserver.notify_address(defaults)) == "127.0.0.1:8770"
    explicit = Settings.from_env(
        {"CLIENT_SERVER_MODE": "1", "DBQUEUE_LOCK_SERVER": "locks:7000", "DBQUEUE_STRATEGY": "x"}
    )
    assert explicit.strategy == "x"  # an explicit strategy is not overridden
    assert str(lockserver.lock_address(explicit)) == "locks:7000"
    assert str(lockserver.notify_address(explicit)) == "locks:7000"
    ipv6 = Settings.from_env({"CLIENT_SERVER_MODE": "yes", "SERVER_HOST": "::1"})
    assert str(lockserver.lock_address(ipv6)) == "[::1]:8970"


@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"CLIENT_SERVER_MODE": "maybe"}, "CLIENT_SERVER_MODE='maybe' is not a boolean"),
        ({"CLIENT_SERVER_MODE": "1", "LOCK_SERVICE_PORT": "x"}, "LOCK_SERVICE_PORT='x'"),
        ({"TIMEOUT_SOCKET_MESSAGE": "0"}, "TIMEOUT_SOCKET_MESSAGE='0' must be at least"),
    ],
)
def test_bad_seed_values_are_refused_by_name(env, fragment):
    with pytest.raises(dbqueue.ConfigurationError, match=fragment):
        Settings.from_env(env)


@pytest.mark.parametrize("text", ["", "host:", "host:port", "host:70000", ":8970", "a:b:c"])
def test_a_bad_address_says_what_it_should_look_like(text):
    with pytest.raises(dbqueue.ConfigurationError, match="is not HOST:PORT"):
        lockserver.parse_address(text)


@pytest.mark.parametrize(
    "text, host, port",
    [("h", "h", 8970), ("h:1", "h", 1), ("[::1]:2", "::1", 2), ("[::1]", "::1", 8970)],
)
def test_addresses(text, host, port):
    address = lockserver.parse_address(text)
    assert (address.host, address.port) == (host, port)


# ---- the server's command line ------------------------------------------------------------------
def test_the_server_reads_the_seed_variables(queue, tmp_path):
    lock_port, notify_port = free_port(), free_port()
    env = {
        "LOCK_SERVICE_PORT": str(lock_port),
        "NOTIFY_SERVICE_PORT": str(notify_port),
        "MAX_CLIENT_THREADS": "7",
        "CHECK_TASKS_INTERVAL": "2.5",
        "TIMEOUT_SOCKET_MESSAGE": "3",
        "LOCK_SERVICE_WAIT_CONN_INTERVAL": "12",
        "DBQUEUE_URL": queue,
    }
    log = tmp_path / "server.log"
    server = subprocess.Popen(
        [DBQUEUE, "server"],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **env},
    )
    try:
        deadline = 60
        import time

        start = time.monotonic()
        while not LISTENING.search(log.read_text()) and time.monotonic() - start < deadline:
            assert server.poll() is None, log.read_text()
            time.sleep(0.05)
        text = log.read_text()
        assert f"listening on 127.0.0.1:{lock_port} and 127.0.0.1:{notify_port};" in text, text
        assert "every 2.5s; up to 7 clients; no token" in text, text
        # The seed's client side finds it through the same variables, on both ports.
        worker_env = {
            "CLIENT_SERVER_MODE": "true",
            "SERVER_HOST": "127.0.0.1",
            "LOCK_SERVICE_PORT": str(lock_port),
            "NOTIFY_SERVICE_PORT": str(notify_port),
        }
        assert run("enqueue", "--url", queue, "noop", env=worker_env, cwd=tmp_path).returncode == 0
        result = run(
            "worker",
            "--url",
            queue,
            "--app",
            "noop_app:app",
            "--burst",
            env=worker_env,
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        assert "strategy lock_server" in result.stderr
        assert "worker stopped: 1 succeeded, 0 failed" in result.stderr
        assert f"connected to the lock server at 127.0.0.1:{lock_port}" in result.stderr
    finally:
        server.terminate()
        assert server.wait(30) == 0, log.read_text()


def test_server_start_up_errors_are_one_line(queue, tmp_path):
    one_line_error(
        run("server", "--url", f"sqlite:///{tmp_path / 'empty.db'}", "--port", "0"),
        "do not exist",
        "dbqueue migrate",
    )
    one_line_error(
        run("server", "--url", "mysql+pymysql://nobody@127.0.0.1:1/x", "--port", "0"),
        "cannot connect",
    )
    busy = start_server(queue, "dbqueue_", tmp_path / "busy.log")
    try:
        one_line_error(
            run("server", "--url", queue, "--port", str(busy.port), "--notify-port", "0"),
            "cannot listen",
            "--port",
        )
    finally:
        busy.stop()
    result = run("server", "--url", queue, "--port", "70000")
    assert result.returncode == 2 and "70000 is not in the range" in result.stderr


def test_an_exposed_server_without_a_token_warns(queue, tmp_path):
    server = start_server(queue, "dbqueue_", tmp_path / "server.log", extra=("--bind", "0.0.0.0"))
    try:
        assert "without a token" in server.tail()
    finally:
        assert server.stop() == 0


# ---- the worker's command line ------------------------------------------------------------------
def test_a_worker_with_a_bad_server_address_is_refused(queue, tmp_path):
    result = run(
        "worker", "--url", queue, "--strategy", "lock_server", "--server", "nowhere:x", "--burst"
    )
    one_line_error(result, "'nowhere:x' is not HOST:PORT")


@pytest.mark.parametrize("extra", [["--burst"], []], ids=["burst", "long-running"])
def test_a_worker_whose_lock_server_is_unreachable_at_start_up_fails_at_once(queue, extra):
    """Nothing listens on the port: one line and exit 1, not a worker waiting forever (a
    server lost after start-up is reconnected to; see test_faults)."""
    address = f"127.0.0.1:{free_port()}"
    args = ["worker", "--url", queue, "--strategy", "lock_server", "--server", address, *extra]
    line = one_line_error(run(*args, timeout=60), "cannot reach the lock server", address)
    assert "start `dbqueue server`" in line


def test_a_worker_with_the_wrong_token_is_refused_at_start_up(queue, tmp_path):
    server = start_server(queue, "dbqueue_", tmp_path / "server.log", token="right")
    try:
        args = ["worker", "--url", queue, "--strategy", "lock_server", "--server", server.address]
        one_line_error(
            run(*args, "--burst", env={"DBQUEUE_LOCK_SERVER_TOKEN": "wrong"}),
            "refused this client: wrong token",
            "DBQUEUE_LOCK_SERVER_TOKEN",
        )
        one_line_error(run(*args, "--burst"), "refused this client: this server requires a token")
        assert "refused" in server.tail()
        result = run(*args, "--burst", env={"DBQUEUE_LOCK_SERVER_TOKEN": "right"})
        assert result.returncode == 0, result.stderr
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("backend", ["singlestore-lock_server"], indirect=True)
def test_dialect_singlestore_with_the_seed_database_variables(backend, tmp_path):
    (tmp_path / "noop_app.py").write_text(APP_MODULE)
    app = backend.app()
    app.enqueue(None, "noop", {})
    env = {
        "DB_HOST": "127.0.0.1",
        "DB_PORT": "3306",
        "DB_BASE": "test",
        "DB_USER": "root",
        "DBQUEUE_LOCK_SERVER": backend.server,
    }
    result = run(
        "worker",
        "--dialect",
        "singlestore",
        "--table-prefix",
        backend.prefix,
        "--app",
        "noop_app:app",
        "--burst",
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "through the singlestoredb driver (the SingleStore path): strategy lock_server" in (
        result.stderr
    )
    assert "worker stopped: 1 succeeded, 0 failed" in result.stderr


def test_migrate_sql_prints_singlestore_ddl_without_connecting(tmp_path):
    result = run("migrate", "--url", "singlestoredb://u@singlestore.invalid/db", "--sql")
    assert result.returncode == 0, result.stderr
    assert "CREATE ROWSTORE TABLE dbqueue_jobs" in result.stdout
    assert "SHARD KEY (id)" in result.stdout
