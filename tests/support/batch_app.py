"""The App the batch-task process tests run in real worker processes:

    dbqueue worker --app support.batch_app:app --url … --queue batches

Batch task ``sync`` writes one effects row per job of its batch (keyed by job id, with the
worker's pid) in the batch's transaction, so that a job whose writes committed twice would break
the primary key and one lost would miss its row. A job whose payload holds ``hold`` makes its
batch say it started (a file per worker pid in ``dir``) and wait until ``dir/release`` exists.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dbqueue
from support.backends import effects

app = dbqueue.App(retry_base_interval=0.05)


@app.batch_task("sync", queue="batches", max_size=10, max_wait=0.3)
def sync(jobs: list[dbqueue.Job], session: dbqueue.JobSession) -> None:
    rows = [{"job_id": j.id, "note": f"attempt {j.attempt}", "pid": os.getpid()} for j in jobs]
    session.execute(effects.insert(), rows)
    session.flush()
    held = [j.payload["dir"] for j in jobs if (j.payload or {}).get("dir")]
    if not held:
        return
    folder = Path(held[0])
    # Written whole (a rename): the test may SIGKILL this process as soon as the file appears.
    partial = folder / f"partial-{os.getpid()}"
    partial.write_text(",".join(str(j.id) for j in jobs))
    partial.rename(folder / f"started-{os.getpid()}")
    deadline = time.monotonic() + 120
    while not (folder / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
