"""Per-tenant databases: ``App(tenant_databases=…)`` and the seed's multi-database mode.

A handler registered with ``tenant_database=True`` gets, besides the job's own session, an ORM
Session on the database of the job's ``tenant``. Where that database is comes from a mapping, a
URL template with ``{tenant}``, a callable, or the seed's credentials API (``MULTI_DATABASE``).

Each tenant gets one Engine, created on first use with a small pool, kept in a bounded LRU
cache: the least recently used engine is disposed (its idle connections closed) when a new
tenant needs the room, so many tenants cannot exhaust the worker's file descriptors or the
servers' connection limits. An engine still in use by a running handler is disposed when that
handler ends. Open connections stay under ``cache_size × pool_size`` idle ones plus one per
handler running.

Two databases cannot commit atomically: the tenant session commits right before the job's own
completion commits (and rolls back when the handler fails). If the queue's commit is then lost,
the job runs again with the tenant's writes already made: handlers make their writes idempotent
with ``job.id`` and ``job.attempt``.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from dbqueue.config import Settings, redact
from dbqueue.errors import ConfigurationError, TenantDatabaseError
from dbqueue.runtime.credentials import CredentialsAPI, CredentialsError
from dbqueue.tasks.registry import TenantHandler

if TYPE_CHECKING:
    from dbqueue.job import Job

log = logging.getLogger("dbqueue.tenants")

DEFAULT_CACHE_SIZE = 20
DEFAULT_POOL_SIZE = 1

#: What ``App(tenant_databases=…)`` takes.
TenantSource = Mapping[Any, Any] | str | Callable[[Any], Any]


class _Flush:
    """``with tenant_session.begin():`` inside a handler: flush on success, no commit."""

    def __init__(self, session: TenantSession) -> None:
        self.session = session

    def __enter__(self) -> TenantSession:
        return self.session

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.session.flush()


class TenantSession(Session):
    """An ORM Session on one tenant's database whose transaction dbqueue ends: ``commit()``
    only flushes, and the worker commits it right before the job's completion commits (or
    rolls it back when the handler fails)."""

    def __init__(self, engine: Engine, tenant: Any, release: Callable[[], None]) -> None:
        super().__init__(bind=engine, expire_on_commit=False)
        self.tenant = tenant
        self._release = release
        self._finished = False

    def commit(self) -> None:
        self.flush()

    def begin(self, nested: bool = False) -> Any:
        if nested:
            return super().begin(nested=True)
        return _Flush(self)

    def close(self) -> None:
        """Ignored inside a handler; dbqueue closes the session when the job ends."""

    def finish(self, ok: bool) -> None:
        """Commit (``ok``) or roll back, then close and give the engine back. A failed commit
        becomes a TenantDatabaseError naming the tenant."""
        if self._finished:
            return
        self._finished = True
        try:
            if ok:
                try:
                    Session.commit(self)
                except sa.exc.SQLAlchemyError as exc:
                    raise TenantDatabaseError(
                        f"tenant {self.tenant!r}: the tenant database's commit failed: "
                        f"{_first_line(exc)}"
                    ) from exc
            else:
                Session.rollback(self)
        finally:
            try:
                Session.close(self)
            finally:
                self._release()


@dataclass
class _Entry:
    engine: Engine
    owned: bool  # created here from a URL: disposed on eviction
    users: int = 0
    evicted: bool = False


class TenantDatabases:
    """Tenant → Engine (cached, bounded) → a TenantSession per job."""

    def __init__(
        self,
        source: TenantSource,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        pool_size: int = DEFAULT_POOL_SIZE,
    ) -> None:
        self.lookup = _lookup_for(source)
        self.cache_size = _positive("tenant_cache_size", cache_size)
        self.pool_size = _positive("tenant_pool_size", pool_size)
        self._engines: OrderedDict[Any, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        #: Engines created and disposed so far (figures for tests and logs).
        self.created = 0
        self.disposed = 0

    @classmethod
    def configure(cls, source: TenantSource | None, settings: Settings) -> TenantDatabases | None:
        """From ``App(tenant_databases=…)``, else MULTI_DATABASE=true's credentials API."""
        if source is None and not settings.multi_database:
            return None
        chosen = source if source is not None else CredentialsAPI.from_settings(settings)
        cache, pool = settings.tenant_cache_size, settings.tenant_pool_size
        return cls(
            chosen,
            cache_size=DEFAULT_CACHE_SIZE if cache is None else cache,
            pool_size=DEFAULT_POOL_SIZE if pool is None else pool,
        )

    def cached(self) -> list[Any]:
        """The tenants whose engines are cached, least recently used first."""
        with self._lock:
            return list(self._engines)

    # ---- sessions -----------------------------------------------------------------------
    def session_for(self, job: Job) -> TenantSession:
        """A session on the database of ``job.tenant``, already connected, so that every
        failure to reach it is a TenantDatabaseError naming the tenant and the cause."""
        tenant = job.tenant
        if tenant is None:
            raise TenantDatabaseError(
                f"job {job.id} (task {job.task!r}) has no tenant, and its handler takes the "
                "tenant's database (tenant_database=True / multi_db_conn): enqueue it with "
                "tenant=…"
            )
        entry = self._acquire(tenant, job)
        session = TenantSession(entry.engine, tenant, lambda: self._release(tenant, entry))
        try:
            session.connection()
        except sa.exc.DBAPIError as exc:
            self.forget(tenant)  # new credentials may be needed: resolve again next time
            session.finish(False)
            raise TenantDatabaseError(
                f"tenant {tenant!r} (job {job.id}): cannot connect to "
                f"{redact(_url_text(entry.engine))}: {_first_line(exc.orig)}"
            ) from None
        except BaseException:
            session.finish(False)
            raise
        return session

    def forget(self, tenant: Any) -> None:
        """Drop a tenant's engine (disposed once no handler uses it)."""
        with self._lock:
            entry = self._engines.pop(tenant, None)
            if entry is not None:
                self._retire(entry)

    def dispose(self) -> None:
        """Dispose every cached engine (those in use, when their handlers end)."""
        with self._lock:
            entries = list(self._engines.values())
            self._engines.clear()
            for entry in entries:
                self._retire(entry)

    # ---- the cache ----------------------------------------------------------------------
    def _acquire(self, tenant: Any, job: Job) -> _Entry:
        with self._lock:
            entry = self._engines.get(tenant)
            if entry is not None:
                self._engines.move_to_end(tenant)
                entry.users += 1
                return entry
        found = self._resolve(tenant, job)  # outside the lock: it may ask an HTTP API
        with self._lock:
            entry = self._engines.get(tenant)
            if entry is not None:  # another thread resolved it meanwhile
                if found.owned:
                    found.engine.dispose()
            else:
                entry = found
                self._engines[tenant] = entry
                self.created += found.owned
                while len(self._engines) > self.cache_size:
                    _, oldest = self._engines.popitem(last=False)
                    self._retire(oldest)
            self._engines.move_to_end(tenant)
            entry.users += 1
            return entry

    def _release(self, tenant: Any, entry: _Entry) -> None:
        with self._lock:
            entry.users -= 1
            if entry.evicted and entry.users == 0:
                self._dispose(entry)

    def _retire(self, entry: _Entry) -> None:
        """Called with the lock held: the entry left the cache."""
        entry.evicted = True
        if entry.users == 0:
            self._dispose(entry)

    def _dispose(self, entry: _Entry) -> None:
        if entry.owned:
            entry.engine.dispose()
            self.disposed += 1

    def _resolve(self, tenant: Any, job: Job) -> _Entry:
        try:
            target = self.lookup(tenant)
        except TenantDatabaseError:
            raise
        except (CredentialsError, LookupError) as exc:
            raise TenantDatabaseError(f"tenant {tenant!r} (job {job.id}): {exc}") from None
        except Exception as exc:
            raise TenantDatabaseError(
                f"tenant {tenant!r} (job {job.id}): the tenant_databases callable raised "
                f"{type(exc).__name__}: {_first_line(exc)}"
            ) from exc
        if target is None:
            raise TenantDatabaseError(
                f"tenant {tenant!r} (job {job.id}): unknown tenant (tenant_databases has no "
                "database for it)"
            )
        if isinstance(target, Engine):
            return _Entry(target, owned=False)
        try:
            url = sa.engine.make_url(target)
        except (sa.exc.ArgumentError, ValueError, TypeError):
            raise TenantDatabaseError(
                f"tenant {tenant!r} (job {job.id}): tenant_databases gave "
                f"{type(target).__name__} {redact(str(target))!r}, not a database URL or Engine"
            ) from None
        try:
            return _Entry(self._create_engine(url), owned=True)
        except Exception as exc:  # an unknown driver, a bad option
            raise TenantDatabaseError(
                f"tenant {tenant!r} (job {job.id}): cannot create an engine for "
                f"{redact(str(url))}: {_first_line(exc)}"
            ) from None

    def _create_engine(self, url: sa.engine.URL) -> Engine:
        """A small pool: ``pool_size`` idle connections kept; more while several handlers use
        the tenant at once (each handler holds one), closed when they end."""
        options: dict[str, Any] = {"pool_pre_ping": True}
        if url.get_backend_name() != "sqlite":
            options.update(pool_size=self.pool_size, max_overflow=-1)
        return sa.create_engine(url, **options)


def bind(tenants: TenantDatabases | None, handler: TenantHandler, session: Any) -> Any:
    """``handler(job, session)`` that opens the tenant's session, hands it to the job's
    session (which commits or rolls it back with the job: ``attach_tenant``) and calls the
    handler with it."""

    def run(job: Job, job_session: Any) -> Any:
        if tenants is None:
            raise TenantDatabaseError(
                f"job {job.id} (task {job.task!r}, tenant {job.tenant!r}): its handler takes "
                "the tenant's database, but the App has no tenant_databases: pass "
                "App(tenant_databases=…) or set MULTI_DATABASE=true"
            )
        tenant_session = tenants.session_for(job)
        session.attach_tenant(tenant_session)
        return handler.call(job, job_session, tenant_session)

    return run


def _lookup_for(source: Any) -> Callable[[Any], Any]:
    """Tenant → URL / Engine / None (unknown), from what the App was given."""
    if isinstance(source, str):
        if "{tenant}" not in source:
            raise ConfigurationError(
                f"tenant_databases={redact(source)!r} is a URL without {{tenant}}: write a "
                "template such as postgresql+psycopg2://app@db/erp_{tenant}, or pass a mapping"
            )
        return lambda tenant: source.replace("{tenant}", str(tenant))
    if isinstance(source, Mapping):
        table = dict(source)

        def look_up(tenant: Any) -> Any:
            found = table.get(tenant, table.get(str(tenant)))
            if found is None:
                known = ", ".join(repr(k) for k in list(table)[:10]) or "none"
                raise LookupError(f"unknown tenant: not in tenant_databases (known: {known})")
            return found

        return look_up
    if callable(source):
        return source  # type: ignore[no-any-return]
    raise ConfigurationError(
        f"tenant_databases takes a mapping tenant → URL, a URL template with {{tenant}} or a "
        f"callable tenant → URL or Engine, not {type(source).__name__}"
    )


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name}={value!r} must be a whole number of at least 1")
    return value


def _url_text(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def _first_line(exc: BaseException | None) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
