"""The lock_server strategy's locks as a process sees them (``LockServerLocks``), against a
real ``dbqueue server``: which questions travel, and what a reconnect changes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.lockserver import RawClient, ServerProcess, start_server
from support.waiting import wait_for

import dbqueue
from dbqueue.lockserver import client as clients
from dbqueue.lockserver import protocol
from dbqueue.lockserver.locks import LockServerLocks


@pytest.fixture
def queue_db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    dbqueue.App(url).migrate()
    return url


class Sent:
    """The ops this process's connection writes, in order."""

    def __init__(self, client: clients.LockServerClient) -> None:
        self.ops: list[str] = []
        write = client._write

        def recording(sock: Any, message: dict[str, Any]) -> None:
            self.ops.append(message["op"])
            write(sock, message)

        client._write = recording  # type: ignore[method-assign]


@pytest.fixture
def locks(queue_db: str, tmp_path: Path) -> Iterator[tuple[LockServerLocks, Sent, Any]]:
    """The locks, what they send, and ``restart(before_reclaim)``: kill the server, start
    another on its port, and call ``before_reclaim(server)`` once this process is connected
    again, before it asks for its locks back (connect hooks run in the order they were added)."""
    servers: list[ServerProcess] = [start_server(queue_db, "dbqueue_", tmp_path / "s.log")]
    client = clients.connect(
        protocol.parse_address(servers[0].address), token=None, timeout=5.0, name="test"
    )
    assert client.wait_connected(10)
    pending: list[Callable[[ServerProcess], None]] = []

    def first_hook(send: Any) -> None:
        while pending:
            pending.pop()(servers[-1])

    client.add_connect_hook(first_hook)

    def restart(before_reclaim: Callable[[ServerProcess], None]) -> None:
        port = servers[-1].port
        servers[-1].kill()
        pending.append(before_reclaim)
        servers.append(start_server(queue_db, "dbqueue_", tmp_path / "s.log", port=port))

    try:
        yield LockServerLocks(client), Sent(client), restart
    finally:
        client.remove_connect_hook(first_hook)
        clients.disconnect(client)
        for server in servers:
            server.stop()


def test_an_outcome_asks_nothing_while_the_connection_that_took_the_locks_is_up(locks):
    backend, sent, _ = locks
    names = ["t:job:1", "t:job:2"]
    assert backend.try_acquire(None, names) == [True, True]
    answer = backend.ask_holding(names)
    assert answer(None) is True
    assert "holding" not in sent.ops, sent.ops
    # A lock this owner does not hold is asked about, and is not held.
    assert backend.ask_holding(["t:job:3"])(None) is False
    assert "holding" in sent.ops


def test_after_a_reconnect_an_outcome_asks_the_server_and_sees_a_lock_taken_meanwhile(locks):
    backend, sent, restart = locks
    assert backend.try_acquire(None, ["t:job:1", "t:job:2"]) == [True, True]
    connection = backend.client.connection_number()
    others: list[RawClient] = []

    def take_job_2(server: ServerProcess) -> None:
        other = RawClient(server.host, server.port)
        others.append(other)
        other.hello()
        reply = other.request({"op": "acquire", "id": 1, "names": ["t:job:2"], "owner": "x"})
        assert reply["taken"] == [True]

    try:
        restart(take_job_2)
        wait_for(
            lambda: backend.client.connection_number() not in (None, connection),
            30,
            "the reconnect",
        )
        assert others, "the other client never took the lock"
        sent.ops.clear()
        assert backend.ask_holding(["t:job:1"])(None) is True  # taken back on reconnect
        assert backend.ask_holding(["t:job:2"])(None) is False  # the other client's now
        assert sent.ops.count("holding") == 2, sent.ops
    finally:
        for other in others:
            other.close()
