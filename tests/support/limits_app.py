"""The App the queue-limit tests run in real worker processes:

    dbqueue worker --app support.limits_app:app --url … --queue exclusive --queue three \\
        --queue-limit three=3

Queue ``exclusive`` is limited here, with ``app.queue(..., concurrency=1)``; the test limits
``three`` on the command line. Task ``timed`` records when its run started and ended (this
host's clock, which every worker process shares) on its effects row, written in the job's own
transaction: only runs whose outcome committed are recorded, each once. The payload may ask it
to say it started (a file holding its pid), wait for a file, and sleep.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dbqueue
from support.backends import effects

app = dbqueue.App(retry_base_interval=0.05)
app.queue("exclusive", concurrency=1)


@app.task("timed")
def timed(job: dbqueue.Job, session: dbqueue.JobSession) -> str:
    payload = job.payload or {}
    start = time.time()
    if payload.get("started_file"):
        Path(payload["started_file"]).write_text(str(os.getpid()))
    if payload.get("wait_file"):
        deadline = time.monotonic() + 120
        while not Path(payload["wait_file"]).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    time.sleep(float(payload.get("sleep", 0)))
    end = time.time()
    session.execute(
        effects.insert().values(job_id=job.id, note=f"{start!r} {end!r}", pid=os.getpid())
    )
    return "timed"
