"""`dbqueue server` as a real process: locks, pushes, and what it does with bad clients.

The server polls a real (SQLite) queue table; the clients here are bare sockets, so each test
sends exactly the bytes it means to. "Dropped" means the server closed the connection; every
test that drops a client then checks that a well-behaved client connected all along is still
served. Waits are on events (a reply, a closed socket) with generous deadlines.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.lockserver import RawClient, ServerProcess, start_server
from support.waiting import wait_for

import dbqueue
from dbqueue.lockserver import protocol

MESSAGE_TIMEOUT = 1.0
IDLE_TIMEOUT = 3.0
MAX_CLIENTS = 6
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def queue_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('lockserver') / 'queue.db'}"
    dbqueue.App(url).migrate()
    return url


def _server(queue_db: str, tmp_path_factory, token: str | None = None) -> ServerProcess:
    log = tmp_path_factory.mktemp("server") / "server.log"
    return start_server(
        queue_db,
        "dbqueue_",
        log,
        token=token,
        extra=(
            "--message-timeout",
            str(MESSAGE_TIMEOUT),
            "--idle-timeout",
            str(IDLE_TIMEOUT),
            "--max-clients",
            str(MAX_CLIENTS),
        ),
    )


@pytest.fixture(scope="module")
def server(queue_db, tmp_path_factory) -> Iterator[ServerProcess]:
    process = _server(queue_db, tmp_path_factory)
    yield process
    assert process.stop() == 0, process.tail()


@pytest.fixture(scope="module")
def token_server(queue_db, tmp_path_factory) -> Iterator[ServerProcess]:
    process = _server(queue_db, tmp_path_factory, token=TOKEN)
    yield process
    assert process.stop() == 0, process.tail()


def connect(server: ServerProcess, token: str | None = None) -> RawClient:
    client = RawClient(server.host, server.port)
    reply = client.hello(token=token if token is not None else server.token)
    assert reply["ok"], reply
    return client


def acquire(client: RawClient, names: list[str], owner: str = "o", request_id: int = 1) -> list:
    return client.request({"op": "acquire", "id": request_id, "names": names, "owner": owner})[
        "taken"
    ]


def still_served(client: RawClient) -> None:
    assert client.request({"op": "ping", "id": 99}) == {"id": 99, "ok": True}


# ---- locks --------------------------------------------------------------------------------------
def test_a_lock_has_one_holder_and_dies_with_its_connection(server):
    with connect(server) as a, connect(server) as b:
        assert acquire(a, ["t:job:1", "t:job:2"]) == [True, True]
        assert acquire(b, ["t:job:1", "t:job:3"]) == [False, True]
        held = a.request({"op": "holding", "id": 2, "names": ["t:job:1"], "owner": "o"})
        assert held["held"] == [True]
        held = b.request({"op": "holding", "id": 2, "names": ["t:job:1"], "owner": "o"})
        assert held["held"] == [False]
        a.close()  # as a killed worker's kernel would: the server frees its locks at once
        wait_for(lambda: acquire(b, ["t:job:1"], request_id=3) == [True], 10, "the lock")
        assert acquire(b, ["t:job:2"], request_id=4) == [True]


def test_locks_are_not_reentrant_and_only_their_owner_releases_them(server):
    with connect(server) as a, connect(server) as b:
        assert acquire(a, ["t:job:10"], owner="thread-1") == [True]
        assert acquire(a, ["t:job:10"], owner="thread-1") == [False]  # held, even by itself
        assert acquire(a, ["t:job:10"], owner="thread-2") == [False]
        release = {"op": "release", "names": ["t:job:10"]}
        assert b.request({**release, "id": 1, "owner": "thread-1"})["released"] == 0
        assert a.request({**release, "id": 2, "owner": "thread-2"})["released"] == 0
        assert a.request({**release, "id": 3, "owner": "thread-1"})["released"] == 1
        assert acquire(b, ["t:job:10"]) == [True]


def test_a_bad_request_gets_an_error_and_the_connection_goes_on(server):
    with connect(server) as client:
        reply = client.request({"op": "acquire", "id": 1, "names": "not a list"})
        assert reply["ok"] is False and "names" in reply["error"]
        reply = client.request({"op": "frobnicate", "id": 2})
        assert reply["ok"] is False and "unknown op" in reply["error"]
        too_many = [f"n{i}" for i in range(protocol.MAX_NAMES + 1)]
        reply = client.request({"op": "acquire", "id": 3, "names": too_many})
        assert reply["ok"] is False and "limit" in reply["error"]
        still_served(client)


# ---- bad clients --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http-request"),
        pytest.param(struct.pack("!I", 8) + b"not json", id="not-json"),
        pytest.param(struct.pack("!I", 2) + b"[]", id="not-an-object"),
        pytest.param(struct.pack("!I", 4) + b'"\xff"', id="not-utf8"),
        pytest.param(protocol.encode({"no": "op"}), id="no-op"),
        pytest.param(protocol.encode({"op": "acquire", "id": 1, "names": ["x"]}), id="no-hello"),
    ],
)
def test_garbage_is_dropped_and_the_others_are_served(server, garbage):
    with connect(server) as good, RawClient(server.host, server.port) as bad:
        bad.send_raw(garbage)
        assert bad.closed_by_server(timeout=10), "the server kept a client that sent garbage"
        still_served(good)


def test_garbage_after_hello_is_dropped_and_its_locks_freed(server):
    with connect(server) as good, connect(server) as bad:
        assert acquire(bad, ["t:job:20"]) == [True]
        bad.send_raw(struct.pack("!I", 5) + b"\xff\xfe\x00ab")
        assert bad.closed_by_server(timeout=10)
        assert acquire(good, ["t:job:20"]) == [True]


def test_a_message_over_the_size_limit_is_refused_from_its_header(server):
    with connect(server) as good, connect(server) as big:
        # Only the header is sent: the server must not wait for (or buffer) 10 MB of body.
        big.send_raw(struct.pack("!I", 10 * 1024 * 1024))
        assert big.closed_by_server(timeout=10)
        still_served(good)
    assert "announced a message of 10485760 bytes" in server.tail()


def test_a_client_that_sends_nothing_is_dropped_after_the_message_timeout(server):
    with connect(server) as good, RawClient(server.host, server.port) as silent:
        started = time.monotonic()
        assert silent.closed_by_server(timeout=30)
        assert time.monotonic() - started >= MESSAGE_TIMEOUT * 0.9
        still_served(good)


def test_a_half_sent_message_is_dropped_after_the_message_timeout(server):
    with connect(server) as good, connect(server) as slow:
        slow.send_raw(protocol.encode({"op": "ping", "id": 1})[:6])  # header and 2 body bytes
        assert slow.closed_by_server(timeout=30)
        still_served(good)


def test_a_silent_client_is_dropped_after_the_idle_timeout_and_its_locks_freed(server):
    with connect(server) as idle:
        assert acquire(idle, ["t:job:30"]) == [True]
        started = time.monotonic()
        assert idle.closed_by_server(timeout=30)  # never pinged
        assert time.monotonic() - started >= IDLE_TIMEOUT * 0.9
    with connect(server) as good:
        assert acquire(good, ["t:job:30"]) == [True]


def test_a_client_that_does_not_read_its_replies_is_dropped_and_its_locks_freed(server):
    """Requests keep coming, replies pile up unread: once the server's buffer is over its
    high-water mark it stops reading that client, and drops it after the message timeout."""
    with connect(server) as deaf:
        assert acquire(deaf, ["t:job:40"]) == [True]
        ping = protocol.encode({"op": "ping", "id": 7})
        deaf.sock.settimeout(0.5)
        started = time.monotonic()
        dropped = False
        while not dropped and time.monotonic() - started < 60:
            try:  # never reading: the replies fill the buffers, then the server stops reading
                deaf.sock.sendall(ping * 1000)
            except TimeoutError:
                continue
            except (ConnectionError, BrokenPipeError):
                dropped = True
        assert dropped, "the server kept a client that does not read its replies"
    with connect(server) as good:  # (one connected all along would idle out meanwhile)
        assert acquire(good, ["t:job:40"]) == [True]
    assert "it does not read its replies" in server.tail()


def test_no_more_than_max_clients_are_served(queue_db, tmp_path):
    limited = start_server(
        queue_db, "dbqueue_", tmp_path / "server.log", extra=("--max-clients", "3")
    )
    clients = [connect(limited) for _ in range(3)]
    try:
        with RawClient(limited.host, limited.port) as extra:
            reply = extra.receive()
            assert reply["ok"] is False and "server full" in reply["error"], reply
            assert "MAX_CLIENT_THREADS" in reply["error"] and reply.get("retry") is True
            assert extra.closed_by_server(timeout=10)
        for client in clients:
            still_served(client)
        clients.pop().close()
        # The freed slot is taken again (the server notices the close at once).
        wait_for(lambda: _hello_ok(limited), 10, "a free slot")
    finally:
        for client in clients:
            client.close()
        assert limited.stop() == 0, limited.tail()


def _hello_ok(server: ServerProcess) -> bool:
    with RawClient(server.host, server.port) as client:
        return bool(client.hello().get("ok"))


# ---- handshake ----------------------------------------------------------------------------------
def test_a_wrong_or_missing_token_is_refused(token_server):
    for token, expected in ((None, "requires a token"), ("wrong", "wrong token")):
        with RawClient(token_server.host, token_server.port) as client:
            message = {"op": "hello", "protocol": protocol.PROTOCOL, "version": 1, "client": "t"}
            if token is not None:
                message["token"] = token
            client.send(message)
            reply = client.receive()
            assert reply["ok"] is False and expected in reply["error"], reply
            assert "DBQUEUE_LOCK_SERVER_TOKEN" in reply["error"]
            assert client.closed_by_server(timeout=10)
    with connect(token_server, token=TOKEN) as client:
        still_served(client)


def test_another_protocol_version_is_refused(server):
    with RawClient(server.host, server.port) as client:
        reply = client.hello(version=protocol.VERSION + 1)
        assert reply["ok"] is False and "version" in reply["error"], reply
        assert client.closed_by_server(timeout=10)


# ---- wake-ups -----------------------------------------------------------------------------------
def test_a_hint_wakes_exactly_the_subscribers_of_its_queue(server):
    with connect(server) as a, connect(server) as b, connect(server) as enqueuer:
        a.request({"op": "subscribe", "id": 1, "queues": ["hint_q1"]})
        b.request({"op": "subscribe", "id": 1, "queues": ["hint_q2"]})
        enqueuer.request({"op": "hint", "id": 1, "queues": ["hint_q1"]})
        assert a.receive() == {"op": "wake", "queue": "hint_q1"}
        # The hint was handled before b's ping: a wake for b would have come before its reply.
        assert b.request({"op": "ping", "id": 5}) == {"id": 5, "ok": True}


def test_the_server_poll_wakes_subscribers_of_queues_with_runnable_jobs(server, queue_db):
    engine = sa.create_engine(queue_db)
    try:
        with connect(server) as subscriber:
            subscriber.request({"op": "subscribe", "id": 1, "queues": ["polled_q"]})
            with engine.begin() as conn:  # a plain SQL insert: nobody hints, the poll finds it
                conn.execute(
                    sa.text("INSERT INTO dbqueue_jobs (task, queue) VALUES ('t', 'polled_q')")
                )
            assert subscriber.receive() == {"op": "wake", "queue": "polled_q"}
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM dbqueue_jobs WHERE queue = 'polled_q'"))
        engine.dispose()


def test_stats_count_clients_locks_and_subscribers(server):
    with connect(server) as a:
        acquire(a, ["t:job:40", "t:job:41"])
        a.request({"op": "subscribe", "id": 2, "queues": ["s"]})
        stats = a.request({"op": "stats", "id": 3})
        assert stats["clients"] >= 1 and stats["locks"] >= 2 and stats["subscribers"] >= 1


def test_the_server_says_where_it_listens_and_what_it_polls(server):
    text = server.tail()
    assert f"listening on {server.address}" in text
    assert "polling dbqueue_jobs on sqlite" in text and "no token" in text


def test_token_server_says_a_token_is_required(token_server):
    assert "token required" in token_server.tail()


def test_the_notify_port_serves_the_same_protocol(queue_db, tmp_path: Path):
    with socket.socket() as probe:  # a free port for the second listener
        probe.bind(("127.0.0.1", 0))
        notify_port = probe.getsockname()[1]
    process = start_server(
        queue_db, "dbqueue_", tmp_path / "server.log", extra=("--notify-port", str(notify_port))
    )
    try:
        assert f"and 127.0.0.1:{notify_port};" in process.tail()
        for port in (process.port, notify_port):
            with RawClient(process.host, port) as client:
                assert client.hello()["ok"]
                still_served(client)
    finally:
        assert process.stop() == 0, process.tail()
