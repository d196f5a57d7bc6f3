"""A run event that crossed the real broker reads as a CloudEvent with the SDK's AMQP binding.

Binary content mode: the attributes are AMQP 0-9-1 headers with the ``cloudEvents:`` prefix (the AMQP
binding's application-properties, as RabbitMQ carries them), datacontenttype is the content type and
``data`` is the body, the longrun envelope.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import aio_pika
import pytest
from cloudevents.core.bindings import amqp as ce_amqp

from longrun.bus import topology
from longrun.bus.codec import to_message
from longrun.bus.connection import Bus
from longrun.envelope import Envelope, decode, make
from tests.infra import Infra

pytestmark = pytest.mark.integration

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _cloud_event(message: aio_pika.abc.AbstractIncomingMessage) -> Any:
    """The consumer's side of the mapping: headers -> application-properties, content_type, body."""
    headers = dict(message.headers)
    return ce_amqp.from_binary_event(ce_amqp.AMQPMessage(
        properties={"content-type": message.content_type},
        application_properties={k: v for k, v in headers.items() if k.startswith("cloudEvents:")},
        application_data=message.body,
    ))


async def _through_the_broker(infra: Infra, bus: Bus, envelope: Envelope,
                              routing_key: str) -> aio_pika.abc.AbstractIncomingMessage:
    """``envelope`` published as the relay publishes it, to a topic exchange of its own, and the
    delivery a consumer bound ``acme.run.#`` (what a tenant's consumer binds) receives."""
    name = f"tests.cloudevents.{uuid.uuid4().hex[:8]}"
    connection = await aio_pika.connect(infra.amqp_url)
    try:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC, auto_delete=True)
        queue = await channel.declare_queue(name, exclusive=True)
        await queue.bind(exchange, "acme.run.#")
        await bus.publish(name, routing_key, to_message(envelope))
        async with queue.iterator() as deliveries:
            async with asyncio.timeout(10):
                message = await anext(deliveries)
            await message.ack()
        return message
    finally:
        await connection.close()


async def test_a_published_run_event_is_a_binary_mode_cloudevent(infra: Infra, bus: Bus) -> None:
    event = make("run.event", {
        "seq": 4, "event_type": "run.status_changed", "status": "COMPLETED",
        "data": {"from": "RUNNING", "stage": "done", "reason": "acceptance passed"},
        "labels": {"team": "payments"},
        "outcome": {"status": "COMPLETED", "terminal_reason": "done", "acceptance": None, "receipts": []}},
        producer="scheduler", tenant_id="acme", run_id="run-ce-1", correlation_id="key-ce-1",
        causation_id="evt-cause-1", data_class="public", trace=TRACEPARENT)
    message = await _through_the_broker(infra, bus, event, topology.status_key("acme", "COMPLETED"))

    assert message.routing_key == "acme.run.status.completed"
    assert "cloudEvents:time" in message.headers, "the SDK would silently default a missing time to now"
    ce = _cloud_event(message)
    assert ce.get_specversion() == "1.0"
    assert ce.get_id() == event.event_id == message.message_id
    assert ce.get_source() == "scheduler"
    assert ce.get_type() == "run.event" == message.type
    assert ce.get_subject() == "run-ce-1"
    assert ce.get_time() == event.occurred_at
    assert ce.get_datacontenttype() == "application/json"
    assert ce.get_data() == json.loads(event.model_dump_json())  # data is the whole envelope
    assert decode(message.body) == event
    # The longrun headers and AMQP properties beside the CloudEvents attributes.
    assert message.headers["schema_version"] == 3
    assert message.headers["tenant_id"] == "acme"
    assert message.headers["traceparent"] == TRACEPARENT
    assert message.correlation_id == "key-ce-1"
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT


async def test_an_event_without_a_run_has_no_subject(infra: Infra, bus: Bus) -> None:
    rejected: Envelope = make("run.rejected", {
        "code": "unknown_workflow", "reason": "no workflow 'nope'", "idempotency_key": "key-ce-2",
        "refused_event_id": "evt-refused-2"},
        producer="scheduler", tenant_id="acme", correlation_id="key-ce-2", causation_id="evt-refused-2")
    message = await _through_the_broker(infra, bus, rejected, topology.event_key("acme", "rejected"))

    ce = _cloud_event(message)
    assert "cloudEvents:subject" not in message.headers and ce.get_subject() is None
    assert (ce.get_id(), ce.get_type(), ce.get_source()) == (rejected.event_id, "run.rejected", "scheduler")
    assert ce.get_time() == rejected.occurred_at
    assert ce.get_data() == json.loads(rejected.model_dump_json())
