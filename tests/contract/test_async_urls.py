"""An asyncio driver's URL (postgresql+asyncpg://, mysql+aiomysql://, sqlite+aiosqlite://) given
where a sync engine is needed — an App's URL, the command line's --url — runs on the same
database through its sync driver, instead of failing at the first statement with MissingGreenlet
and "coroutine was never awaited"; a driver no dialect module maps is refused in one line. On
every database whose asyncio driver is installed."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from support.backends import effects
from test_cli import run

import dbqueue


def async_url_of(backend) -> str:
    url = backend.dialect_class.async_url(sa.engine.make_url(backend.url))
    return url.render_as_string(hide_password=False)


def test_an_app_on_an_async_url_runs_its_jobs_through_the_sync_driver(async_database):
    async_url = async_url_of(async_database)
    app = dbqueue.App(async_url, table_prefix=async_database.prefix, retry_base_interval=0.05)
    expected = dbqueue.App(async_database.url).engine.dialect.driver
    assert app.engine.dialect.driver == expected  # the sync driver dbqueue installs
    assert not app.engine.dialect.is_async

    @app.task
    def note(job, session):
        session.execute(effects.insert().values(job_id=job.id, note="ran"))

    sync_id = app.enqueue(None, "note")

    async def enqueue() -> int:
        try:
            assert app.async_engine.url.drivername == sa.engine.make_url(async_url).drivername
            return await app.aenqueue(None, "note")
        finally:
            await app.adispose()

    async_id = asyncio.run(enqueue())
    async_database.drain(app)
    jobs = {j["id"]: j["status"] for j in async_database.jobs()}
    assert jobs == {sync_id: "succeeded", async_id: "succeeded"}
    assert sorted(async_database.effect_ids()) == sorted([sync_id, async_id])


def test_the_command_line_takes_an_async_url(async_database, tmp_path):
    result = run(
        "stats", "--url", async_url_of(async_database), "--table-prefix", async_database.prefix,
        cwd=tmp_path, env=async_database.env(),
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "MissingGreenlet" not in output and "never awaited" not in output, output


def test_an_async_driver_no_dialect_module_maps_is_refused_in_one_line(async_database, monkeypatch):
    monkeypatch.setattr(async_database.dialect_class, "sync_drivers", {})
    async_url = sa.engine.make_url(async_url_of(async_database))
    app = dbqueue.App(async_url.render_as_string(hide_password=False))
    with pytest.raises(dbqueue.ConfigurationError) as refused:
        app.engine  # noqa: B018 - created on first use
    sync_driver = async_database.dialect_class.url_driver
    assert str(refused.value) == (
        f"{async_url.drivername}:// is an asyncio driver, and a sync engine is needed here: "
        f"give the URL with a sync driver ({sync_driver}://…) and the asyncio one as async_url"
    )
