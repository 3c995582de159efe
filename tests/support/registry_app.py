"""The App of the registry, metrics and tracing tests' worker processes
(``dbqueue worker --app support.registry_app:app``, on DBQUEUE_URL / --table-prefix).

``block`` touches its payload's ``started`` file, then waits for its ``release`` file;
``quick`` does nothing; ``flaky`` fails its first attempt; ``doomed`` always fails.
With DBQUEUE_TEST_SPANS set, the process traces (dbqueue.tracing) into an in-memory exporter
and writes the finished spans to that file as JSON lines when it exits.
"""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path

import dbqueue

app = dbqueue.App()


@app.task("block")
def block(job: dbqueue.Job, session) -> None:
    Path(job.payload["started"]).write_text(str(job.id))
    deadline = time.monotonic() + 120
    while not Path(job.payload["release"]).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


@app.task("quick")
def quick(job: dbqueue.Job, session) -> None:
    return None


@app.task("flaky", max_attempts=2)
def flaky(job: dbqueue.Job, session) -> None:
    if job.attempt == 1:
        raise RuntimeError("first attempt fails")


@app.task("doomed", max_attempts=1)
def doomed(job: dbqueue.Job, session) -> None:
    raise RuntimeError("always fails")


def _trace_to(path: str) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from dbqueue.observability import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.instrument(app, tracer_provider=provider)

    @atexit.register
    def dump() -> None:
        with open(path, "w") as out:
            for span in exporter.get_finished_spans():
                out.write(span.to_json(indent=None) + "\n")


if os.environ.get("DBQUEUE_TEST_SPANS"):
    _trace_to(os.environ["DBQUEUE_TEST_SPANS"])
