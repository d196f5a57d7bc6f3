"""The envelope every message on the bus travels in.

Strict (``extra="forbid"``) and frozen. ``type`` + ``schema_version`` decide how the
payload is parsed; the envelope itself never guesses. Field names are docs/bus.md's envelope
table and map onto CloudEvents attributes in ``longrun_client.codec``.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


TENANT_PATTERN = r"^[A-Za-z0-9_-]{1,100}$"


class DataClass(str, Enum):
    """How far a payload may travel: sensitive payloads never reach broadcast events."""

    PUBLIC = "public"
    INTERNAL = "internal"
    SENSITIVE = "sensitive"


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Envelope(Strict):
    """Metadata common to every message; subclasses fix ``type``, version and payload."""

    event_id: str = Field(min_length=1, max_length=200, description="Unique per distinct event; dedup key.")
    type: str = Field(min_length=1, description="Message type, e.g. run.create.")
    schema_version: int = Field(ge=1, description="Version of the payload schema for this type.")
    producer: str = Field(min_length=1, description="Service or client that produced the message.")
    tenant_id: str = Field(pattern=TENANT_PATTERN, description=(
        "Letters, digits, '_' and '-', at most 100: it is the first word of the tenant's event routing keys."))
    trace: str | None = Field(default=None, description="W3C traceparent of the creating span.")
    run_id: str | None = None
    step_id: str | None = None
    attempt_id: str | None = None
    causation_id: str | None = Field(default=None, description="event_id of the message that caused this one.")
    correlation_id: str | None = None
    expected_state_version: int | None = Field(default=None, ge=0)
    occurred_at: datetime
    data_class: DataClass = DataClass.INTERNAL
    payload: Any


def new_event_id() -> str:
    """A random (version 4) UUID as text: what ``str(uuid.uuid4())`` gives, at half its cost (every
    envelope gets one)."""
    b = bytearray(os.urandom(16))
    b[6] = b[6] & 0x0F | 0x40  # version 4
    b[8] = b[8] & 0x3F | 0x80  # RFC 4122 variant
    x = b.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def utcnow() -> datetime:
    return datetime.now(UTC)


def envelope_fields(**overrides: Any) -> dict[str, Any]:
    """Defaults for the metadata a producer does not choose itself."""
    base: dict[str, Any] = {"event_id": new_event_id(), "occurred_at": utcnow()}
    base.update(overrides)
    return base
