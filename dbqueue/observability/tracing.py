"""OpenTelemetry traces (``pip install 'dbqueue-sql[otel]'``, opentelemetry-api; configure the SDK
and an exporter as for any application).

``instrument(app)`` gives every enqueue a PRODUCER span (``send <queue>``) and every job run a
CONSUMER span (``process <queue>``), with the messaging semantic conventions' attributes. The
producer's W3C trace context is stored on the job row (the ``traceparent`` column); the worker
reads it with the claim and makes the consumer span its child and links it, so a trace goes from
the request that enqueued to the handler that ran, however long the job waited between.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dbqueue.base.distribution import install_hint
from dbqueue.errors import ConfigurationError

if TYPE_CHECKING:
    from dbqueue.app.facade import App

SYSTEM = "dbqueue"
_INSTRUMENTED = "dbqueue.tracing"


def _otel() -> tuple[Any, Any]:
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        raise ConfigurationError(
            f"OpenTelemetry tracing needs opentelemetry-api: {install_hint('otel')}"
        ) from None
    return trace, TraceContextTextMapPropagator()


def instrument(app: App, tracer_provider: Any = None) -> None:
    """Trace ``app``'s enqueues and the jobs its workers run (idempotent). ``tracer_provider``:
    default, the global one (``opentelemetry.trace.set_tracer_provider``)."""
    instruments = app.context.instruments
    if getattr(instruments, _INSTRUMENTED, False):
        return
    trace, propagator = _otel()
    tracer = trace.get_tracer("dbqueue", tracer_provider=tracer_provider)
    tracing = _Tracing(trace, tracer, propagator)
    instruments.add(enqueue=tracing.on_enqueue, run=tracing.wrap_run)
    setattr(instruments, _INSTRUMENTED, True)


class _Tracing:
    def __init__(self, trace: Any, tracer: Any, propagator: Any) -> None:
        self.trace = trace
        self.tracer = tracer
        self.propagator = propagator

    def on_enqueue(self, jobs: Sequence[Any]) -> Any:
        """A producer span per job, started before the INSERT so that the row carries it."""
        kind = self.trace.SpanKind.PRODUCER
        spans = []
        for job in jobs:
            span = self.tracer.start_span(
                f"send {job.queue}",
                kind=kind,
                attributes={
                    "messaging.system": SYSTEM,
                    "messaging.operation": "publish",
                    "messaging.operation.type": "send",
                    "messaging.operation.name": "send",
                    "messaging.destination.name": job.queue,
                    "dbqueue.task": job.task,
                },
            )
            carrier: dict[str, str] = {}
            self.propagator.inject(carrier, context=self.trace.set_span_in_context(span))
            job.traceparent = carrier.get("traceparent")
            spans.append(span)

        def after(ids: Sequence[int], error: BaseException | None) -> None:
            for index, span in enumerate(spans):
                if index < len(ids):
                    span.set_attribute("messaging.message.id", str(ids[index]))
                if error is not None:
                    span.record_exception(error)
                    span.set_status(self.trace.Status(self.trace.StatusCode.ERROR, str(error)))
                span.end()

        return after

    def wrap_run(self, run_one: Any) -> Any:
        trace, tracer, propagator = self.trace, self.tracer, self.propagator
        kind = trace.SpanKind.CONSUMER

        def run(session: Any, job: Any) -> Any:
            parent, links = None, []
            if job.traceparent:
                parent = propagator.extract({"traceparent": job.traceparent})
                producer = trace.get_current_span(parent).get_span_context()
                if producer.is_valid:
                    links = [trace.Link(producer)]
            with tracer.start_as_current_span(
                f"process {job.queue}",
                context=parent,
                kind=kind,
                links=links,
                attributes={
                    "messaging.system": SYSTEM,
                    "messaging.operation": "process",
                    "messaging.operation.type": "process",
                    "messaging.operation.name": "process",
                    "messaging.destination.name": job.queue,
                    "messaging.message.id": str(job.id),
                    "dbqueue.task": job.task,
                    "dbqueue.attempt": job.attempt,
                },
            ) as span:
                outcome = run_one(session, job)
                if not outcome.ok:
                    message = (outcome.message or "failed").splitlines()[0]
                    span.set_attribute(
                        "dbqueue.outcome", "cancelled" if outcome.cancelled else "failed"
                    )
                    span.set_status(trace.Status(trace.StatusCode.ERROR, message))
                return outcome

        return run
