"""The seed compatibility layer (dbqueue.compat): its place above the core, the seed's status
words on a Job, and the seed's LOG_DEBUG variable in a real worker process."""

from __future__ import annotations

import ast
import datetime as dt
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dbqueue
from dbqueue import Job

PACKAGE = Path(dbqueue.__file__).parent
#: Modules allowed to import the compat package: the package's facade and the seed's CLI tool.
ABOVE_THE_CORE = {PACKAGE / "__init__.py", PACKAGE / "db_gen.py"}


def imported_modules(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            stem = ".".join(base) if node.level else ""
            module = ".".join(part for part in (stem, node.module or "") if part)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def test_the_core_never_imports_the_compat_package():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in ABOVE_THE_CORE or (PACKAGE / "compat") in path.parents:
            continue
        bad = {m for m in imported_modules(path) if m.split(".")[:2] == ["dbqueue", "compat"]}
        if bad:
            offenders[str(path.relative_to(PACKAGE))] = sorted(bad)
    assert offenders == {}


def test_the_seed_names_live_in_dbqueue_compat_and_stay_exported():
    for name in ("QueueClient", "WorkerBase", "WorkerPubSubBase", "Subscriber", "DeadSubscriber"):
        assert name in dbqueue.__all__
        assert getattr(dbqueue, name).__module__.startswith("dbqueue.compat."), name
    assert importlib.util.find_spec("dbqueue.seed") is None


NOW = dt.datetime.now(dt.timezone.utc)
# Far from NOW: the module is imported once per run, and a loaded run can last over an hour.
HOUR = dt.timedelta(days=2)


@pytest.mark.parametrize(
    "fields, word",
    [
        ({"status": "available", "run_at": NOW + HOUR}, "agendada"),
        ({"status": "available", "run_at": NOW - HOUR}, "pendente"),
        ({"status": "available", "run_at": NOW - HOUR, "started_at": NOW}, "processando"),
        ({"status": "running", "run_at": NOW - HOUR, "started_at": NOW}, "processando"),
        ({"status": "succeeded"}, "sucesso"),
        ({"status": "dead"}, "falha"),
        ({"status": "cancelled"}, "cancelada"),
    ],
)
def test_the_seed_status_word_of_each_dbqueue_status(fields, word):
    job = Job(**fields)
    assert job["status"] == word
    assert job.status == fields["status"]


def test_seed_keys_derived_from_several_attributes():
    waiting = Job(id=5, status="available", run_at=NOW + HOUR, previous_status="failed")
    assert waiting["proxima_tentativa"] == NOW + HOUR and waiting["id_anterior"] == 5
    assert waiting["status_anterior"] == "falha" and waiting["estouro_tentativas"] is False
    dead = Job(id=6, status="dead", previous_status="failed")
    assert dead["estouro_tentativas"] is True and dead["proxima_tentativa"] is None
    publication = Job(id=7, status="succeeded", subscription_id="*")
    assert publication["pub_sub"] is True and publication["subscriber_id"] == "*"
    assert "mensagem_anterior" in publication and "no_such_column" not in publication
    with pytest.raises(KeyError, match="no_such_column"):
        publication["no_such_column"]


WORKER_SCRIPT = textwrap.dedent(
    """
    import dbqueue

    class Worker(dbqueue.WorkerBase):
        def execute(self, payload, job, session):
            raise RuntimeError("always fails")

    dbqueue.App().migrate()
    dbqueue.App().enqueue(None, "fails", {})
    Worker().run(burst=True, poll_interval=0.02)
    """
)


@pytest.mark.parametrize("log_debug", ["true", "false"])
def test_worker_base_run_honours_log_debug(log_debug, tmp_path):
    script = tmp_path / "seed_worker.py"
    script.write_text(WORKER_SCRIPT, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DBQUEUE_", "DB_", "QUEUE_"))}
    env.update(
        DBQUEUE_URL=f"sqlite:///{tmp_path / 'seed.db'}",
        QUEUE_MAX_RETRY="1",
        LOG_DEBUG=log_debug,
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    debug_lines = [line for line in result.stderr.splitlines() if " DEBUG dbqueue." in line]
    if log_debug == "true":
        assert any("job 1 (fails) raised" in line for line in debug_lines), result.stderr
    else:
        assert debug_lines == [], result.stderr
