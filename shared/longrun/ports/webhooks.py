"""A webhook provider as its author declares it (how it signs, what its events mean), and what an event
means to longrun as the use cases and the stores exchange it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Translated:
    """What a provider's event means to longrun: which wait it answers and the fact it proves."""

    event_id: str
    correlation_key: str
    fact_key: str
    fact: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Signature:
    """How a provider signs a delivery: HMAC-SHA256 with the shared secret, hex, after ``prefix``, in
    the request header ``header``."""

    header: str
    prefix: str = "sha256="
    timestamp_header: str | None = None
    """For a provider that signs the time of sending with the body (``<timestamp>.<body>``, Unix
    seconds, the timestamp in this header): a delivery sent outside the replay window
    (``LONGRUN_WEBHOOK_REPLAY_WINDOW``) is refused, so a captured request cannot be sent again later.
    None: the provider signs the body alone, and dedup by its event id is the protection."""


@dataclass(frozen=True, slots=True)
class Provider:
    """A webhook provider (``POST /webhooks/<name>``), loaded by ``longrun.webhook_providers``."""

    translate: Callable[[dict[str, Any]], Translated]
    """Its verified payload to what it means to longrun (``ValueError`` when it means nothing longrun knows)."""
    signature: Signature
