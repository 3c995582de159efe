"""Shared fixtures: real PostgreSQL, MariaDB/MySQL and SQLite, never a mock database.

Each backend is a (database, claim strategy) pair. A server that cannot be reached is skipped
with a loud banner when run locally, and fails the run when CI=true.
Override the servers with DBQUEUE_TEST_POSTGRESQL_URL / DBQUEUE_TEST_MYSQL_URL /
DBQUEUE_TEST_SINGLESTORE_URL. lock_server backends get a real `dbqueue server` process per
database, started on a free port the first time one is used.
"""

from __future__ import annotations

import compileall
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from support import reporting, scheduling  # noqa: E402
from support.backends import (  # noqa: E402
    BACKENDS,
    DEFAULT_STRATEGY,
    Backend,
    backend_keys,
    database_keys,
    prepare_database,
    requires_backend,
)
from support.lockserver import ServerProcess, start_server  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    if reporting.is_main_process(config):
        _compile_sources()
        if getattr(config, "cache", None) is not None:
            reporting.clear(config, "chaos")


def _compile_sources() -> None:
    """Bytecode for dbqueue and the test helpers, written once before the run: with
    PYTHONDONTWRITEBYTECODE set (or in a fresh clone) every worker, CLI and lock-server process
    a test starts would otherwise compile dbqueue's sources again (~0.5 s each)."""
    root = Path(__file__).resolve().parents[1]
    for folder in (root / "dbqueue", root / "tests" / "support"):
        compileall.compile_dir(folder, quiet=2)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
    """The chaos suite's counts (tests/chaos), from whichever process ran each case."""
    if not reporting.is_main_process(config) or getattr(config, "cache", None) is None:
        return
    lines = reporting.lines(config, "chaos")
    if lines:
        terminalreporter.section("dbqueue chaos")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def sqlite_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sqlite") / "dbqueue-test.db"


@pytest.fixture(scope="session")
def _prepared(sqlite_path: Path) -> dict[str, str]:
    """database name → URL, for the databases whose schema this session already migrated."""
    return {}


@pytest.fixture(scope="session")
def lock_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    """database name → its `dbqueue server` process, stopped when the session ends."""
    servers: dict[str, ServerProcess] = {}
    yield servers
    for server in servers.values():
        code = server.stop()
        assert code == 0, f"dbqueue server exited with {code}:\n{server.tail()}"


def _server_for(request: pytest.FixtureRequest, database: str, url: str, prefix: str) -> str:
    servers = request.getfixturevalue("lock_servers")
    if database not in servers or servers[database].process.poll() is not None:
        log = request.getfixturevalue("tmp_path_factory").mktemp("lockserver") / "server.log"
        servers[database] = start_server(url, prefix, log)
    return servers[database].address


#: The modes jobs run in: in their claim's transaction (the default), or outside it under a
#: lease. A contract module that sets ``BOTH_MODES = True`` (or a test marked ``both_modes``)
#: runs its ``backend`` and ``database`` tests in both.
EXECUTION_MODES = {"in_transaction": None, "leased": False}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    both = getattr(metafunc.module, "BOTH_MODES", False)
    both = both or metafunc.definition.get_closest_marker("both_modes") is not None
    if both and "execution_mode" in metafunc.fixturenames:
        metafunc.parametrize("execution_mode", list(EXECUTION_MODES))


@pytest.fixture
def execution_mode() -> str:
    """In the claim's transaction, unless the module runs in both modes."""
    return "in_transaction"


def _backend(request: pytest.FixtureRequest, key: str, mode: str = "in_transaction") -> Backend:
    spec = BACKENDS[key]
    url = spec.url(request.getfixturevalue("sqlite_path"))
    requires_backend(spec.database, url)
    prepared = request.getfixturevalue("_prepared")
    if spec.database not in prepared:
        prepare_database(url, spec.prefix)
        prepared[spec.database] = url
    server = None
    if spec.claims_through_lock_server:
        server = _server_for(request, spec.database, url, spec.prefix)
    transaction = EXECUTION_MODES[mode]
    backend = Backend(spec.key, spec.database, spec.strategy, url, spec.prefix, server, transaction)
    backend.reset()
    return backend


@pytest.fixture
def lock_server(request: pytest.FixtureRequest):
    """``lock_server(backend)`` → HOST:PORT of the lock server on that backend's database."""
    return lambda backend: _server_for(request, backend.database, backend.url, backend.prefix)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A database without an asyncio driver (SingleStore) gets no async-handler cases (a test
    proves the worker refuses them at start-up, naming the fix). In pytest-xdist's workers the
    longest files come first (support/scheduling.py)."""
    items[:] = [item for item in items if not _async_without_driver(item)]
    if hasattr(config, "workerinput"):
        scheduling.order(items)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # no xdist (-p no:xdist): unused
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201
    """``--dist loadfile``, with the longest files cut into one unit per database."""
    if config.getvalue("dist") == "loadfile":
        return scheduling.Scheduler(config, log)
    return None


def _async_without_driver(item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    spec = BACKENDS.get(str(params.get("backend", "")))
    wants_loop = params.get("kind") == "async" or params.get("slots") == "loop"
    return wants_loop and spec is not None and not spec.has_async_driver


@pytest.fixture(params=sorted(BACKENDS), ids=lambda key: key)
def backend(request: pytest.FixtureRequest, execution_mode: str) -> Iterator[Backend]:
    """Every (database, strategy) pair: the contract suite runs once per pair (and mode)."""
    yield _backend(request, request.param, execution_mode)


@pytest.fixture(params=sorted({spec.database for spec in BACKENDS.values()}))
def database(request: pytest.FixtureRequest, execution_mode: str) -> Iterator[Backend]:
    """Every database once, with its default strategy (for tests that are not about claims)."""
    key = f"{request.param}-{DEFAULT_STRATEGY[request.param]}"
    yield _backend(request, key, execution_mode)


@pytest.fixture(scope="module", params=database_keys())
def each_database(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Every database once per module, with its default strategy, its tables emptied once:
    for tests that work on tables of their own, or queues of their own."""
    yield _backend(request, request.param)


@pytest.fixture(scope="module", params=backend_keys())
def each_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Every (database, strategy) pair once per module, its tables emptied once: for tests
    that each use queues of their own."""
    yield _backend(request, request.param)


@pytest.fixture(params=database_keys(lambda spec: spec.has_async_driver))
def async_database(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Every database with an asyncio driver once, with its default strategy."""
    yield _backend(request, request.param)


@pytest.fixture(params=database_keys(lambda spec: spec.inserts_notify))
def notifying_database(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Every database whose inserts NOTIFY listening workers once, with its default strategy."""
    yield _backend(request, request.param)


@pytest.fixture(params=database_keys(lambda spec: spec.single_writer and spec.inserts_wake_workers))
def commit_watched_database(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Every single-writer database whose workers watch its commits once (default strategy)."""
    yield _backend(request, request.param)


@pytest.fixture
def postgresql(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """PostgreSQL alone, for what only it has (LISTEN/NOTIFY, schemas)."""
    yield _backend(request, "postgresql-skip_locked")


@pytest.fixture
def sqlite(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """SQLite alone, for what only it has (its commits watched through ``data_version``)."""
    yield _backend(request, "sqlite-sqlite")
