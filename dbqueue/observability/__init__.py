"""Prometheus metrics and OpenTelemetry traces for an App (``dbqueue.metrics``,
``dbqueue.tracing``)."""
