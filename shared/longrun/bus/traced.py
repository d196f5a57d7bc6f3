"""Publishing outbox messages with a ``publish`` span each: the relay's, and a worker's own (``bus.eager``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.trace import SpanKind, StatusCode

from longrun import otel
from longrun.bus.codec import to_message
from longrun.bus.connection import Bus


async def publish_traced(bus: Bus, messages: Sequence[tuple[str, str, Mapping[str, Any], str | None]]
                         ) -> list[BaseException | None]:
    """``Bus.publish_many`` of ``(exchange, routing_key, envelope, run_root)``, with a ``publish`` span per
    message, a child of its run's root linked to the span that made it; the message tells its consumer
    the root (``otel.RUN_TRACE_HEADER``)."""
    spans, items = [], []
    for exchange, routing_key, envelope, run_root in messages:
        message = to_message(dict(envelope))
        if run_root:
            message.headers[otel.RUN_TRACE_HEADER] = run_root
        items.append((exchange, routing_key, message))
        spans.append(otel.start_run_span(f"publish {exchange}", run_root, cause=envelope.get("trace"),
                                         kind=SpanKind.PRODUCER, attributes={
                                             "messaging.system": "rabbitmq", "messaging.operation.name": "publish",
                                             "messaging.operation.type": "send",
                                             "messaging.destination.name": exchange,
                                             "messaging.rabbitmq.destination.routing_key": routing_key,
                                             "messaging.message.id": envelope.get("event_id") or "",
                                             "longrun.run_id": envelope.get("run_id") or ""}))
    results = await bus.publish_many(items)
    for span, error in zip(spans, results, strict=True):
        if error is not None:
            span.set_status(StatusCode.ERROR, str(error))
        span.end()
    return results
