"""The dashboard in a real headless Chromium, on PostgreSQL, MariaDB and SQLite (issue 18): every
page loads with real jobs, a filter narrows the list, requeue one and in bulk change the
database, a POST without the CSRF value or the token is refused, read-only shows no action.

One browser session and one set of served dashboards per database (module scope); the pages are
saved as screenshots under the run's temporary directory (or $DBQUEUE_SCREENSHOTS).
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import pytest
import requests
from support.backends import BACKENDS, DEFAULT_STRATEGY, Backend, prepare_database, requires_backend
from support.dashboard import chromium, screenshot_dir, serve_asgi

from dbqueue.dashboard import create_app

pytest.importorskip("selenium")
from selenium.common.exceptions import (  # noqa: E402
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

TOKEN = "t0ken-for-tests"


def make_backend(request, database: str) -> Backend:
    spec = BACKENDS[f"{database}-{DEFAULT_STRATEGY[database]}"]
    url = spec.url(request.getfixturevalue("sqlite_path"))
    requires_backend(database, url)
    prepared = request.getfixturevalue("_prepared")
    if database not in prepared:
        prepare_database(url, spec.prefix)
        prepared[database] = url
    backend = Backend(spec.key, database, spec.strategy, url, spec.prefix)
    backend.reset()
    return backend


def fill(backend: Backend):
    """Real jobs: dead ones in two queues and tasks, succeeded, scheduled; a subscription."""
    app = backend.app(max_attempts=1)

    @app.task("dash_boom", queue="dq1")
    def boom(job, session):
        raise RuntimeError(f"boom {job.payload['n']}")

    @app.task("dash_fine", queue="dq1")
    def fine(job, session):
        return {"ok": job.payload["n"]}

    for n in range(6):
        words = "needle in the hay" if n == 3 else "hay"
        app.enqueue(
            None,
            "dash_boom",
            {"n": n, "words": words},
            queue="dq1" if n < 4 else "dq2",
            external_key=f"order-{n}",
            tenant=n,
        )
        app.enqueue(None, "dash_fine", {"n": n})
    backend.run_worker(app, queues=["dq1", "dq2"])
    app.enqueue(None, "dash_fine", {"n": 99}, delay=3600)
    app.add_subscription(None, "dash_sub", "dash_topic")
    return app


@pytest.fixture(scope="module", params=["postgresql", "mysql", "sqlite"])
def site(request, tmp_path_factory):
    backend = make_backend(request, request.param)
    app = fill(backend)
    shots = screenshot_dir(tmp_path_factory.mktemp(f"screenshots-{request.param}"))
    with contextlib.ExitStack() as stack:
        open_url = stack.enter_context(serve_asgi(create_app(app, actions_without_token=True)))
        token_url = stack.enter_context(serve_asgi(create_app(app, token=TOKEN)))
        read_only_url = stack.enter_context(serve_asgi(create_app(app, read_only=True)))
        driver = chromium()
        stack.callback(driver.quit)
        yield Site(backend, app, driver, open_url, token_url, read_only_url, shots)
    app.engine.dispose()


class Site:
    def __init__(self, backend, app, driver, url, token_url, read_only_url, shots):
        self.backend, self.app, self.driver = backend, app, driver
        self.url, self.token_url, self.read_only_url, self.shots = (
            url,
            token_url,
            read_only_url,
            shots,
        )

    def visit(self, path: str, shot: str | None = None, base: str | None = None):
        self.driver.get((base or self.url) + path)
        if shot:
            self.driver.save_screenshot(str(self.shots / f"{self.backend.database}-{shot}.png"))
        return self.driver

    def rows(self, table: str = "jobs") -> list[str]:
        found = self.driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr[data-id]")
        return [row.get_attribute("data-id") for row in found]

    def done(self) -> str:
        """The line an action's page shows once the POST and its redirect have loaded."""
        found = WebDriverWait(self.driver, 120).until(
            expected_conditions.presence_of_element_located((By.ID, "done"))
        )
        return found.text

    def status(self, job_id: int) -> str:
        return self.app.get_job(job_id)["status"]

    def dead_ids(self, **filters) -> list[int]:
        return sorted(j["id"] for j in self.app.dead_jobs(limit=1000, **filters))


def test_every_page_loads_with_real_jobs(site):
    d = site.visit("/", "overview")
    queues = {
        r.get_attribute("data-queue")
        for r in d.find_elements(By.CSS_SELECTOR, "#queues tr[data-queue]")
    }
    assert queues == {"dq1", "dq2"}
    assert d.find_element(By.ID, "total-dead").text == "6"
    assert d.find_elements(By.CSS_SELECTOR, "svg.chart rect.dead")  # the last hour's chart
    site.visit("/jobs", "jobs")
    assert len(site.rows()) == 13
    dead = site.dead_ids()
    d = site.visit(f"/jobs/{dead[0]}", "job")
    assert '"n": 0' in d.find_element(By.ID, "payload").text
    assert "RuntimeError: boom 0" in d.find_element(By.ID, "message").text
    columns = d.find_element(By.ID, "columns").text
    assert "external_key order-0" in columns and "max_attempts 1" in columns
    site.visit("/dead", "dead")
    assert sorted(map(int, site.rows())) == dead
    d = site.visit("/subscriptions", "subscriptions")
    assert site.rows("subscriptions") == ["dash_sub"]
    for path in ("/periodic", "/workers"):
        d = site.visit(path, path.strip("/"))
        assert d.find_element(By.TAG_NAME, "h1").text
    stats = requests.get(site.url + "/api/v1/stats", timeout=30).json()
    assert stats["total"]["morgue_length"] == 6 and stats["by_queue"]["dq2"]["morgue_length"] == 2
    assert stats == site.app.stats_report()  # the same function as `dbqueue stats --json`


def replaced(element: Any) -> Any:
    """``expected_conditions.staleness_of``, also when ChromeDriver, asked about an element whose
    page is being replaced at that moment, answers "Node with given id does not belong to the
    document" instead of "stale element reference" (both mean the page changed)."""

    def gone(driver: Any) -> bool:
        try:
            element.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            if "does not belong to the document" not in str(exc):
                raise
            return True
        return False

    return gone


def test_a_filter_narrows_the_list(site):
    d = site.visit("/jobs")
    d.find_element(By.NAME, "text").send_keys("needle")
    before = d.find_element(By.ID, "jobs")
    d.find_element(By.ID, "apply").click()
    WebDriverWait(d, 120).until(replaced(before))
    WebDriverWait(d, 120).until(expected_conditions.presence_of_element_located((By.ID, "jobs")))
    site.driver.save_screenshot(str(site.shots / f"{site.backend.database}-filtered.png"))
    (only,) = site.rows()
    assert site.app.get_job(int(only))["external_key"] == "order-3"
    site.visit("/jobs?queue=dq2&status=dead")
    assert len(site.rows()) == 2
    site.visit("/jobs?tenant=5&external_key=order-5")
    assert len(site.rows()) == 1
    assert re.match(r"1 matching job\b", site.driver.find_element(By.ID, "count").text)


def test_requeue_one_then_in_bulk_changes_the_database(site):
    first, *others = site.dead_ids()
    d = site.visit("/dead")
    d.find_element(By.CSS_SELECTOR, f'tr[data-id="{first}"] button[data-action="requeue"]').click()
    assert f"requeued 1: {first}" in site.done()
    assert site.status(first) == "available"
    in_dq2 = site.dead_ids(queue="dq2")
    d = site.visit("/dead?queue=dq2", "dead-filtered")
    d.execute_script("window.confirm = () => true")
    d.find_element(By.CSS_SELECTOR, 'button[data-action="requeue-matching"]').click()
    assert f"requeued {len(in_dq2)}" in site.done()
    assert [site.status(i) for i in in_dq2] == ["available"] * len(in_dq2)
    assert site.dead_ids() == sorted(set(others) - set(in_dq2))  # the others stay dead
    d = site.visit("/subscriptions")
    d.find_element(By.CSS_SELECTOR, 'tr[data-id="dash_sub"] button').click()
    assert site.done() == "subscription dash_sub disabled"
    assert site.app.get_subscription("dash_sub").active is False


def test_posts_without_the_csrf_value_or_the_token_are_refused(site):
    (victim, *_) = site.dead_ids()
    browser = requests.Session()
    browser.get(site.url + "/dead", timeout=30)  # sets the CSRF cookie
    cookie = browser.cookies["dbqueue_csrf"]
    refused = [
        browser.post(site.url + "/actions/requeue", data={"ids": victim}, timeout=30),
        browser.post(
            site.url + "/actions/requeue", data={"ids": victim, "csrf": "forged"}, timeout=30
        ),
        requests.post(
            site.url + "/actions/delete", data={"ids": victim, "csrf": cookie}, timeout=30
        ),
    ]
    assert [r.status_code for r in refused] == [403, 403, 403]
    other = requests.Session()
    other.cookies.set("dbqueue_csrf", cookie)
    no_token = other.post(
        site.token_url + "/actions/delete",
        data={"ids": victim, "csrf": cookie},
        allow_redirects=False,
        timeout=30,
    )
    assert no_token.status_code == 403 and "token" in no_token.text
    assert requests.get(site.token_url + "/api/v1/stats", timeout=30).status_code == 401
    assert site.status(victim) == "dead"  # nothing happened
    with_token = other.post(
        site.token_url + "/actions/delete",
        data={"ids": victim, "csrf": cookie},
        headers={"Authorization": f"Bearer {TOKEN}"},
        allow_redirects=False,
        timeout=30,
    )
    assert with_token.status_code == 303 and site.app.get_job(victim) is None
    d = site.visit("/dead", "login", base=site.token_url)  # the browser is sent to log in
    d.find_element(By.NAME, "token").send_keys(TOKEN)
    d.find_element(By.CSS_SELECTOR, "form button").click()
    WebDriverWait(d, 120).until(  # back on the dead page, with its actions
        expected_conditions.presence_of_element_located(
            (By.CSS_SELECTOR, 'button[data-action="requeue"]')
        )
    )


def test_read_only_shows_no_action(site):
    dead = site.dead_ids()
    for path in ("/dead", f"/jobs/{dead[0]}", "/subscriptions", "/jobs?status=scheduled"):
        d = site.visit(
            path, "read-only-" + path.strip("/").split("/")[0].split("?")[0], site.read_only_url
        )
        assert d.find_elements(By.CSS_SELECTOR, "button.action, form[method=post]") == [], path
        assert "read-only" in d.find_element(By.TAG_NAME, "nav").text
    session = requests.Session()
    session.get(site.read_only_url + "/dead", timeout=30)
    posted = session.post(
        site.read_only_url + "/actions/requeue",
        data={"ids": dead[0], "csrf": session.cookies["dbqueue_csrf"]},
        timeout=30,
    )
    assert posted.status_code in (404, 405) and site.status(dead[0]) == "dead"
