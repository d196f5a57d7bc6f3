"""Envelope -> AMQP message: defined in ``longrun_client.codec`` (producers map envelopes exactly
as the runtime does) and re-exported here for the runtime."""

from __future__ import annotations

from longrun_client.codec import broker_user, to_message

__all__ = ["broker_user", "to_message"]
