"""Tracing: a message made inside a span carries its traceparent, and the consumer continues that trace."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun import otel
from longrun.bus import topology
from longrun.bus.consumer import QueueConsumer
from longrun.envelope import Envelope
from longrun.ports.inbox import Outcome
from tests.fixtures import eventually
from tests.integration.bus_helpers import publish, route, wakeup

pytestmark = pytest.mark.integration


async def test_the_consumer_continues_the_producers_trace_into_the_messages_it_makes(
        clean, engine, bus, monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = InMemorySpanExporter()
    monkeypatch.setattr(otel, "_exporting", otel.exporting())  # put back after the test: later tests export nothing
    otel.setup("tests", exporter)
    made: list[Envelope] = []

    async def handler(conn: AsyncConnection, envelope: Envelope) -> dict[str, object]:
        made.append(wakeup("run-trace-next", "follow-up"))
        return {}

    outcomes: list[Outcome] = []

    async def record(outcome: Outcome) -> None:
        outcomes.append(outcome)

    # Given a message published inside a producer span
    with otel.tracer.start_as_current_span("producer") as producer:
        message = wakeup("run-trace", "w-1")
        await publish(bus, message)
    trace_id = producer.get_span_context().trace_id
    assert message.trace is not None and f"{trace_id:032x}" in message.trace
    # When a consumer handles it and makes a new message in its handler
    consumer = QueueConsumer(bus=bus, engine=engine, service="worker",
                             queue=topology.partition_queue("worker", route("run-trace")[2]), handler=handler,
                             prefetch=5, max_attempts=2, on_outcome=record)
    await consumer.start()
    await eventually(lambda: _one(outcomes), what="the message handled")
    await consumer.stop()
    trace.get_tracer_provider().force_flush()  # type: ignore[attr-defined]
    # Then the processing span and the new message belong to the producer's trace
    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("process ")]
    assert [s.context.trace_id for s in spans] == [trace_id]
    assert spans[0].attributes["messaging.system"] == "rabbitmq"
    assert spans[0].attributes["messaging.message.id"] == message.event_id
    assert made and made[0].trace is not None and f"{trace_id:032x}" in made[0].trace


async def _one(items: list[Outcome]) -> bool:
    return len(items) >= 1
