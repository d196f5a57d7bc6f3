"""Envelope -> AMQP message.

The body is the whole envelope as JSON (CloudEvents "structured" spirit); the AMQP
properties and ``cloudEvents:*`` headers mirror the attributes so brokers, tracing and
non-Python consumers can route and filter without parsing the body.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika

from longrun_client.model import Envelope


DEVELOPMENT_USER = "guest"
"""RabbitMQ's development user, and the user of an AMQP URL that names none."""


def broker_user(url: str) -> str:
    """The user an AMQP URL logs in as: what a ``run.create`` published on it sets as ``user_id``."""
    user = urlsplit(url).username
    return unquote(user) if user else DEVELOPMENT_USER


def to_message(envelope: Envelope | dict[str, Any], *, user_id: str | None = None) -> aio_pika.Message:
    """A persistent message; a dict is an envelope already in its JSON form (as the outbox keeps it).

    ``user_id``: the publishing connection's broker user (``broker_user``), which a ``run.create``
    must carry: RabbitMQ checks it against the connection, and longrun admits a create only in the
    tenants that user is allowed."""
    data = envelope.model_dump(mode="json") if isinstance(envelope, Envelope) else envelope
    headers: dict[str, Any] = {
        "cloudEvents:specversion": "1.0",
        "cloudEvents:id": data["event_id"],
        "cloudEvents:type": data["type"],
        "cloudEvents:source": data["producer"],
        # The JSON form of occurred_at is RFC 3339 already (UTC written as Z).
        "cloudEvents:time": data["occurred_at"],
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
        message_id=_short(data["event_id"]),
        correlation_id=_short(data.get("correlation_id")),
        type=data["type"],
        timestamp=datetime.fromisoformat(data["occurred_at"]),
        headers=headers,
        user_id=user_id,
    )


SHORT_STRING_BYTES = 255


def _short(value: str | None) -> str | None:
    """``value`` if an AMQP short string (a property) can carry it, else None: an event id of 200
    characters may take 800 bytes, and one property too long fails the whole publish (of a relay's
    batch, every message in it). The body carries the value whole (the event id is in the
    ``cloudEvents:id`` header too: a header's string has no such limit)."""
    if value is None or len(value) * 4 <= SHORT_STRING_BYTES or len(value.encode()) <= SHORT_STRING_BYTES:
        return value
    return None
