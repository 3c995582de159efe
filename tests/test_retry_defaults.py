"""The retry defaults: the App's bounded, growing, jittered backoff; the seed's variables and
classes keeping the seed's rule; explicit options winning over both. No database: an App
never connects until it is used."""

from __future__ import annotations

import random

import pytest

import dbqueue
from dbqueue.compat import QueueClient, WorkerBase
from dbqueue.tasks import retry
from dbqueue.tasks.retry import DEFAULT_MAX_DELAY, polynomial_backoff

URL = "sqlite:///unused-retry-defaults.db"


@pytest.fixture
def randomness(monkeypatch):
    """Pins ``random.random`` to a value the test sets (the jitter's draw)."""
    drawn = [0.0]
    monkeypatch.setattr(random, "random", lambda: drawn[0])
    return drawn


def test_the_default_backoff_grows_is_bounded_and_jitters_within_a_tenth(randomness):
    backoff = retry.DEFAULT_BACKOFF
    attempts = range(1, 200)
    randomness[0] = 0.0
    lowest = [backoff(n) for n in attempts]
    randomness[0] = 0.999999
    highest = [backoff(n) for n in attempts]
    assert lowest[:3] == [16.0, 31.0, 96.0]  # 15 + attempt ** 4
    assert all(a < b for a, b in zip(lowest[:19], lowest[1:20], strict=True))  # grows
    assert lowest == sorted(lowest)  # never shrinks
    assert max(lowest) == DEFAULT_MAX_DELAY  # capped: two days
    assert max(highest) <= DEFAULT_MAX_DELAY * 1.1
    for low, high in zip(lowest, highest, strict=True):
        assert low < high <= low * 1.1
    # Up to the default max attempts, even the highest draw stays below the next lowest.
    assert all(h < lo for h, lo in zip(highest[:18], lowest[1:19], strict=True))
    assert backoff(10**9) <= DEFAULT_MAX_DELAY * 1.1  # no overflow on absurd attempt counts


def test_polynomial_backoff_takes_its_shape_and_refuses_nonsense(randomness):
    backoff = polynomial_backoff(base=1, power=2, jitter=0.5, max_delay=50)
    randomness[0] = 0.5
    assert [backoff(n) for n in (1, 3, 10)] == [2 * 1.25, 10 * 1.25, 50 * 1.25]
    with pytest.raises(dbqueue.ConfigurationError, match="power > 0"):
        polynomial_backoff(power=0)


def test_a_job_failing_with_the_defaults_is_dead_after_six_to_seven_days(randomness):
    randomness[0] = 0.999999
    app = dbqueue.App(URL, environ={})
    waited = sum(app.backoff(n) for n in range(1, app.max_attempts))
    assert app.max_attempts == 20
    assert 6 * 86400 < waited < 7.2 * 86400


def test_the_seeds_variables_bring_the_seeds_rule():
    max_only = dbqueue.App(URL, environ={"QUEUE_MAX_RETRY": "7"})
    assert max_only.max_attempts == 7
    assert [max_only.backoff(n) for n in (1, 2, 3)] == [300.0, 600.0, 900.0]
    interval_only = dbqueue.App(URL, environ={"QUEUE_BASE_INTERVAL_RETRY": "2"})
    assert interval_only.max_attempts == 100
    assert [interval_only.backoff(n) for n in (1, 4)] == [120.0, 480.0]
    both = dbqueue.App(URL, environ={"QUEUE_MAX_RETRY": "3", "QUEUE_BASE_INTERVAL_RETRY": "1"})
    assert (both.max_attempts, both.backoff(2)) == (3, 120.0)


def test_explicit_options_win_over_the_seeds_variables_and_the_defaults(randomness):
    seed = {"QUEUE_MAX_RETRY": "7"}
    assert dbqueue.App(URL, environ=seed, max_attempts=4).max_attempts == 4
    assert dbqueue.App(URL, environ=seed, backoff=lambda n: 1.5).backoff(9) == 1.5
    linear = dbqueue.App(URL, environ={}, retry_base_interval=10)
    assert (linear.max_attempts, linear.backoff(3)) == (20, 30.0)
    fewer = dbqueue.App(URL, environ={}, max_attempts=5)
    assert (fewer.max_attempts, fewer.backoff(1)) == (5, 16.0)


def test_the_seeds_classes_keep_the_seeds_rule(monkeypatch):
    for name in ("QUEUE_MAX_RETRY", "QUEUE_BASE_INTERVAL_RETRY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DBQUEUE_URL", URL)
    client = QueueClient(None)
    worker = WorkerBase()
    for app in (client.app, worker.app):
        assert app.max_attempts == 100
        assert [app.backoff(n) for n in (1, 2)] == [300.0, 600.0]
    monkeypatch.setenv("QUEUE_MAX_RETRY", "9")
    assert QueueClient(None).app.max_attempts == 9
    given = dbqueue.App(URL, environ={})
    assert QueueClient(None, app=given).app.max_attempts == 20  # an App given is used as is


def test_a_bad_seed_variable_is_one_clear_line():
    with pytest.raises(dbqueue.ConfigurationError, match="QUEUE_MAX_RETRY='many' is not"):
        dbqueue.App(URL, environ={"QUEUE_MAX_RETRY": "many"})


def test_the_readmes_retry_options(randomness):
    url = URL
    # README, "Retries and dead jobs":
    backoff = dbqueue.polynomial_backoff(base=5, max_delay=3600)  # 5 + attempt⁴ s, ≤ 1 h, +0-10 %
    app = dbqueue.App(url, max_attempts=8, backoff=backoff)
    seedlike = dbqueue.App(url, retry_base_interval=60)  # 60 s × attempt, 20 attempts
    assert (app.max_attempts, app.backoff(2), app.backoff(9)) == (8, 21.0, 3600.0)
    assert (seedlike.max_attempts, seedlike.backoff(3)) == (20, 180.0)
