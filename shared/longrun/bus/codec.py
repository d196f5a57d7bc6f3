"""Envelope <-> AMQP message.

The body is the whole envelope as JSON (CloudEvents "structured" spirit); the AMQP
properties and ``cloudEvents:*`` headers mirror the attributes so brokers, tracing and
non-Python consumers can route and filter without parsing the body.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import aio_pika

from longrun.envelope import Envelope


def to_message(envelope: Envelope | dict[str, Any]) -> aio_pika.Message:
    data = json.loads(envelope.model_dump_json()) if isinstance(envelope, Envelope) else envelope
    headers: dict[str, Any] = {
        "cloudEvents:specversion": "1.0",
        "cloudEvents:id": data["event_id"],
        "cloudEvents:type": data["type"],
        "cloudEvents:source": data["producer"],
        "schema_version": data["schema_version"],
        "tenant_id": data["tenant_id"],
    }
    if data.get("run_id"):
        headers["cloudEvents:subject"] = data["run_id"]
    if data.get("trace"):
        headers["traceparent"] = data["trace"]
    return aio_pika.Message(
        body=json.dumps(data, separators=(",", ":")).encode(),
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=data["event_id"],
        correlation_id=data.get("correlation_id"),
        type=data["type"],
        timestamp=datetime.fromisoformat(data["occurred_at"]),
        headers=headers,
    )
