"""The App the keys tests run in real worker processes:

    dbqueue worker --app support.keys_app:app --url … --table-prefix …

Tasks ``keyed`` (key_mode ordered, the default) and ``keyed_x`` (exclusive) record on their
effects row, in the job's own transaction, the job's key, its number in the test's enqueue order
(``payload["n"]``) and when the run started and ended (this host's clock, shared by every worker
process): only runs whose outcome committed are recorded, each once. ``fail_first`` fails the
first attempt (before recording); ``started_file``/``wait_file``/``sleep`` as in limits_app.
``plain`` is an unkeyed job recorded the same way.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dbqueue
from support.backends import effects

app = dbqueue.App(retry_base_interval=0.05)


def record(job: dbqueue.Job, session: dbqueue.JobSession) -> str:
    payload = job.payload or {}
    start = time.time()
    if payload.get("fail_first") and job.attempt == 1:
        raise RuntimeError(f"job {job.id} fails its first attempt")
    if payload.get("started_file"):
        Path(payload["started_file"]).write_text(str(os.getpid()))
    if payload.get("wait_file"):
        deadline = time.monotonic() + 120
        while not Path(payload["wait_file"]).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    time.sleep(float(payload.get("sleep", 0)))
    end = time.time()
    note = f"{job.key} {payload.get('n', -1)} {start!r} {end!r}"
    session.execute(effects.insert().values(job_id=job.id, note=note, pid=os.getpid()))
    return "recorded"


app.task("keyed")(record)
app.task("keyed_x", key_mode="exclusive")(record)
app.task("plain")(record)
