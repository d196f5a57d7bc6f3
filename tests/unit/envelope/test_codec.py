"""Envelope -> AMQP message: the properties mirror the body's attributes where AMQP can carry them."""

from __future__ import annotations

import json

import pytest
from pamqp.header import ContentHeader

from longrun.bus.codec import to_message
from longrun.envelope import make


def _marshalled(message) -> bytes:  # type: ignore[no-untyped-def]
    """What the client writes on the wire: it refuses a property longer than AMQP allows."""
    return ContentHeader(body_size=len(message.body), properties=message.properties).marshal()


@pytest.mark.parametrize(("event_id", "correlation_id"), [
    ("e" * 200, "c" * 255),
    # Found by the fuzzer (tests/fuzz): 200 characters of an event id are up to 800 bytes, and one such
    # run.create's answer (run.accepted carries its idempotency key as correlation id) stalled the relay.
    ("\U0001f4a9" * 200, "\U0001f4a9" * 64),
])
def test_a_message_whose_ids_are_too_long_for_properties_carries_them_in_the_body(
        event_id: str, correlation_id: str) -> None:
    envelope = make("run.create", {"workflow": "w", "idempotency_key": "k"}, producer="p", tenant_id="t",
                    event_id=event_id, correlation_id=correlation_id)
    message = to_message(envelope)
    _marshalled(message)
    body = json.loads(message.body)
    assert (body["event_id"], body["correlation_id"], message.headers["cloudEvents:id"]) == (
        event_id, correlation_id, event_id)
    fits = len(event_id.encode()) <= 255
    assert message.message_id == (event_id if fits else None)
    assert message.correlation_id == (correlation_id if len(correlation_id.encode()) <= 255 else None)
