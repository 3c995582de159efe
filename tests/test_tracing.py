"""OpenTelemetry: a producer span per enqueue, a consumer span per job run by a real worker
process, the consumer the producer's child and linked to it through the job row's traceparent.

The test process traces its enqueues into the SDK's in-memory exporter; the worker process
(support/registry_app.py with DBQUEUE_TEST_SPANS) traces into its own and writes its spans to
a file when it exits — SIGTERM, after which its row in the registry of live workers is gone.
"""

from __future__ import annotations

import json
import signal

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from support.registry_worker import QUEUE, start_worker
from support.waiting import wait_for

from dbqueue.observability import tracing


def test_consumer_spans_follow_their_producers_through_the_job_row(postgresql, tmp_path):
    app = postgresql.app()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.instrument(app, tracer_provider=provider)
    tracing.instrument(app, tracer_provider=provider)  # idempotent: still one span per enqueue
    with provider.get_tracer("test").start_as_current_span("request") as request:
        ids = [app.enqueue(None, "quick", queue=QUEUE)]
        ids += app.enqueue_many(
            None,
            [
                {"task": "quick", "queue": QUEUE},
                {"task": "doomed", "queue": QUEUE, "max_attempts": 1},
            ],
        )
    producers = {
        int(s.attributes["messaging.message.id"]): s
        for s in exporter.get_finished_spans()
        if s.kind == SpanKind.PRODUCER
    }
    assert sorted(producers) == sorted(ids)
    for job_id, span in producers.items():
        assert (
            span.name == f"send {QUEUE}"
            and span.parent.span_id == request.get_span_context().span_id
        )
        assert span.attributes["messaging.system"] == "dbqueue"
        assert span.attributes["messaging.destination.name"] == QUEUE
        row = app.get_job(job_id)
        ctx = span.get_span_context()
        assert row["traceparent"].startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")

    spans_file, log = tmp_path / "spans.jsonl", tmp_path / "worker.log"
    worker = start_worker(postgresql, log, None, {"DBQUEUE_TEST_SPANS": str(spans_file)})
    try:
        wait_for(
            lambda: all(app.get_job(i)["status"] in ("succeeded", "dead") for i in ids),
            90,
            "the jobs to run",
            log,
        )
        wait_for(lambda: len(app.workers()) == 1, 30, "the worker's row", log)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(30)
    assert app.workers(include_gone=True) == []  # a stopped worker deletes its row

    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    consumers = {
        int(s["attributes"]["messaging.message.id"]): s
        for s in spans
        if s["kind"] == str(SpanKind.CONSUMER)
    }
    assert sorted(consumers) == sorted(ids)
    for job_id, span in consumers.items():
        producer = producers[job_id].get_span_context()
        assert span["name"] == f"process {QUEUE}"
        assert span["context"]["trace_id"] == f"0x{producer.trace_id:032x}"
        assert span["parent_id"] == f"0x{producer.span_id:016x}"
        assert [link["context"]["span_id"] for link in span["links"]] == [
            f"0x{producer.span_id:016x}"
        ]
        attributes = span["attributes"]
        assert attributes["messaging.system"] == "dbqueue"
        assert attributes["messaging.operation"] == "process"
        assert attributes["messaging.destination.name"] == QUEUE
        failed = app.get_job(job_id)["status"] == "dead"
        status = span["status"]["status_code"]
        assert status == (str(StatusCode.ERROR.name) if failed else "UNSET"), span
