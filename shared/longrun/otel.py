"""OpenTelemetry: one place where the W3C traceparent goes into and comes out of envelopes.

A message made inside a span carries that span's traceparent (``Envelope.trace``); the
consumer continues the trace from it, so one run's path across the scheduler, relay,
worker, timer and gateway is one trace. Span names and attributes follow the messaging
semantic conventions (``process <queue>``, ``messaging.system = rabbitmq``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

tracer = trace.get_tracer("longrun")
EXPORTERS = ("none", "console")
_exporting = False


def setup(service: str, exporter: str | SpanExporter) -> None:
    """Install a tracer provider for this process; "none" keeps propagation without exporting."""
    global _exporting
    provider = TracerProvider(resource=Resource.create({"service.name": f"longrun-{service}"}))
    if exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    elif not isinstance(exporter, str):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    _exporting = exporter != "none"
    trace.set_tracer_provider(provider)


@contextmanager
def continued(name: str, parent: str | None, **attributes: Any) -> Iterator[trace.Span]:
    """A consumer span continuing the trace of the message that caused it.

    When this process exports nothing, no span of its own is made (nobody would see it): the
    caller's span is passed through as the current one, so the messages made here carry the
    caller's traceparent and the trace stays whole across exporting services."""
    context = propagate.extract({"traceparent": parent}) if parent else None
    if not _exporting:
        with trace.use_span(trace.get_current_span(context), end_on_exit=False) as passed:
            yield passed
        return
    with tracer.start_as_current_span(name, context=context, kind=trace.SpanKind.CONSUMER,
                                      attributes={"messaging.system": "rabbitmq", **attributes}) as span:
        yield span
