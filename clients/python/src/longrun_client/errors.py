"""The errors a producer can meet, and the root every longrun error shares.

``ErrorCode`` is the one vocabulary of codes for the whole system (the runtime writes them to
audit rows and events) and an Enum cannot be extended, so every code lives here; the runtime's
``longrun.errors`` re-exports these classes, so ``except PoisonMessage`` there catches what
``decode`` raises here.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from longrun_client.model import Envelope


class ErrorCode(str, Enum):
    CONFIG_INVALID = "config_invalid"
    BUS_UNAVAILABLE = "bus_unavailable"
    UNROUTABLE = "unroutable"
    STALE_REVISION = "stale_revision"
    LEASE_LOST = "lease_lost"
    DECODE_ERROR = "decode_error"
    UNKNOWN_SCHEMA_VERSION = "unknown_schema_version"
    ILLEGAL_TRANSITION = "illegal_transition"
    BUDGET_EXHAUSTED = "budget_exhausted"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    EVENT_REJECTED = "event_rejected"
    ACTION_OUTCOME_UNKNOWN = "action_outcome_unknown"
    INFRA_UNREACHABLE = "infra_unreachable"
    TOOL_REJECTED = "tool_rejected"
    TOOL_UNAVAILABLE = "tool_unavailable"
    PROPOSAL_REJECTED = "proposal_rejected"
    PUBLISH_NOT_CONFIRMED = "publish_not_confirmed"
    RUN_REJECTED = "run_rejected"


class LongrunError(Exception):
    """Root of every error longrun raises on purpose."""

    code: ErrorCode

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PoisonMessage(LongrunError):
    """Never retried: the message goes to quarantine with this error's reason."""


class DecodeError(PoisonMessage):
    code = ErrorCode.DECODE_ERROR

    def __init__(self, reason: str, raw: bytes) -> None:
        self.reason = reason
        self.raw = raw
        super().__init__(f"malformed message: {reason}")


class UnknownSchemaVersion(PoisonMessage):
    code = ErrorCode.UNKNOWN_SCHEMA_VERSION

    def __init__(self, type_: str, schema_version: int, known: list[int]) -> None:
        self.type = type_
        self.schema_version = schema_version
        self.known = known
        known_text = ", ".join(map(str, known)) or "none"
        super().__init__(
            f"unknown schema_version {schema_version} for type {type_!r} (known: {known_text})"
        )


class PublishNotConfirmed(LongrunError):
    """The broker did not take the message: it nacked it, or returned it because nothing is bound
    to its routing key (the topology is not declared on that virtual host). Nothing was created;
    sending the same request again is safe."""

    code = ErrorCode.PUBLISH_NOT_CONFIRMED

    def __init__(self, exchange: str, routing_key: str, cause: str) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.cause = cause
        super().__init__(f"publish to {exchange!r} with key {routing_key!r} was not confirmed: {cause}")


class RunRejected(LongrunError):
    """The runtime refused a run.create; ``rejection`` is the run.rejected payload (code, reason,
    and for a reused key the run it made and both input hashes)."""

    code = ErrorCode.RUN_REJECTED

    def __init__(self, event: Envelope) -> None:
        self.event = event
        self.rejection = event.payload
        super().__init__(f"run.create refused ({self.rejection.code}): {self.rejection.reason}")
