"""OpenTelemetry: where spans go, and one trace per run.

A run's trace starts where it is created: the scheduler's span for its ``run.create`` is the
run's root, and its context is stored with the run (``runs.trace_root``). Every later span of
the run, whichever service makes it and whatever woke the run (a message, a timer, a webhook, an
operator), is a child of that root (``run_span``), linked to the span that made the message which
caused it. A message carries the traceparent of the span that made it (``Envelope.trace``); the
relay adds its run's root (``RUN_TRACE_HEADER``), so a consumer finds the root without a query.
Span names and attributes follow the messaging semantic conventions (``publish <exchange>``,
``process <queue>``, ``messaging.system = rabbitmq``) and the GenAI ones for model calls.

Spans are exported only when an exporter is configured: ``OTEL_TRACES_EXPORTER`` (standard) or
``LONGRUN_OTEL_EXPORTER`` (``none``, the default; ``console``; ``otlp``: OTLP/HTTP, configured by
the standard ``OTEL_EXPORTER_OTLP_*`` variables). Sampling is the standard ``OTEL_TRACES_SAMPLER``
(default: parent-based, always on), decided once per run at its root. Without an exporter no span
is made at all: the context a message carried is passed through as the current one, so what a
process makes carries it, logs name its trace, and the trace stays whole across exporting services.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from longrun_client.registry import traceparent

tracer = trace.get_tracer("longrun")
RUN_TRACE_HEADER = "longrun-run-trace"
"""AMQP header: the traceparent of the root of the run a message is for (set by the relay when it exports)."""
_exporting = False
_root: ContextVar[str | None] = ContextVar("longrun_run_trace", default=None)


def setup(service: str, exporter: str | SpanExporter) -> None:
    """Install a tracer provider for this process; "none" keeps propagation without exporting."""
    global _exporting
    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the name longrun gives.
    resource = Resource.create({"service.name": f"longrun-{service}"}).merge(OTELResourceDetector().detect())
    provider = TracerProvider(resource=resource)
    if exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    elif exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    elif not isinstance(exporter, str):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    _exporting = exporter != "none"
    trace.set_tracer_provider(provider)


def exporting() -> bool:
    """Spans are made and exported (an exporter is configured)."""
    return _exporting


def current() -> str | None:
    """The traceparent of the current span (None outside any)."""
    return traceparent()


def traceparent_of(span: trace.Span) -> str | None:
    """``span``'s W3C traceparent."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def root() -> str | None:
    """The root of the run whose span is current, when the code that opened it knew it."""
    return _root.get()


def _context(parent: str | None) -> Context | None:
    return propagate.extract({"traceparent": parent}) if parent else None


@contextmanager
def run_span(name: str, run_root: str | None, *, cause: str | None = None,
             kind: trace.SpanKind = trace.SpanKind.INTERNAL, attributes: Mapping[str, Any] | None = None
             ) -> Iterator[trace.Span]:
    """A span of a run: the child of its root ``run_root``, linked to ``cause`` (the traceparent of the
    message that caused it). Without a root (a run.create, a run from before roots were stored, a
    message of no run) it continues ``cause``.

    Without an exporter no span is made: ``cause`` (else the root) is passed through as the current
    span, so messages made inside carry it."""
    token = _root.set(run_root)
    try:
        if not _exporting:
            passed = trace.get_current_span(_context(cause or run_root))
            with trace.use_span(passed, end_on_exit=False):
                yield passed
            return
        with trace.use_span(start_run_span(name, run_root, cause=cause, kind=kind, attributes=attributes),
                            end_on_exit=True, record_exception=True, set_status_on_exception=True) as span:
            yield span
    finally:
        _root.reset(token)


@contextmanager
def passing(parent: str | None) -> Iterator[None]:
    """Make ``parent`` (a traceparent; None: none) the current context, without a span of its own: what
    is made inside carries it."""
    with trace.use_span(trace.get_current_span(_context(parent)) if parent else trace.INVALID_SPAN,
                        end_on_exit=False):
        yield


def start_run_span(name: str, run_root: str | None, *, cause: str | None = None,
                   kind: trace.SpanKind = trace.SpanKind.INTERNAL, attributes: Mapping[str, Any] | None = None
                   ) -> trace.Span:
    """``run_span``'s span, started and not made current, for the caller to end (one of a batch)."""
    links = []
    if run_root and cause:
        caused_by = trace.get_current_span(_context(cause)).get_span_context()
        if caused_by.is_valid:
            links.append(trace.Link(caused_by))
    return tracer.start_span(name, context=_context(run_root or cause), kind=kind, links=links,
                             attributes=attributes)
