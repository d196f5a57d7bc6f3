"""Errors raised by longrun, grouped by what the caller must do about them.

Every error carries a stable ``code`` (written to audit rows and events), builds its
own message from typed fields, and is raised ``from`` the driver error it replaces.
Anything that is not a ``LongrunError`` is a bug: it propagates, the delivery is
rejected and, past the queue's delivery limit, the message lands in quarantine.
"""

from __future__ import annotations

# The root, the codes, and what decoding a message raises live with the bus contract in
# longrun-client, so what its decode raises is what the runtime catches.
from longrun_client.errors import (
    DecodeError as DecodeError,
    ErrorCode as ErrorCode,
    LongrunError as LongrunError,
    PoisonMessage as PoisonMessage,
    UnknownSchemaVersion as UnknownSchemaVersion,
)


class ConfigError(LongrunError):
    """One or more LONGRUN_* variables are missing or malformed; all are listed."""

    code = ErrorCode.CONFIG_INVALID

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        lines = "\n".join(f"  {var}: {why}" for var, why in problems)
        super().__init__(f"invalid configuration ({len(problems)} problem(s)):\n{lines}")


class InfrastructureUnreachable(LongrunError):
    """PostgreSQL or RabbitMQ cannot be reached; says what to start and how."""

    code = ErrorCode.INFRA_UNREACHABLE


class TransientError(LongrunError):
    """Retry in-process (bounded, with jitter), then give the delivery back."""


class BusUnavailable(TransientError):
    code = ErrorCode.BUS_UNAVAILABLE


class ToolUnavailable(TransientError):
    """The tool (or model endpoint) definitely did not act; trying again is safe."""

    code = ErrorCode.TOOL_UNAVAILABLE

    def __init__(self, tool: str, cause: str) -> None:
        self.tool = tool
        self.cause = cause
        super().__init__(f"{tool} is unavailable and did not act: {cause}")


class Unroutable(LongrunError):
    """The broker returned a mandatory message: no queue is bound for its key."""

    code = ErrorCode.UNROUTABLE

    def __init__(self, exchange: str, routing_key: str) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        super().__init__(f"message to exchange {exchange!r} with key {routing_key!r} was unroutable")


class ConflictError(LongrunError):
    """Someone else moved first: re-read and re-decide, or drop."""


class StaleRevision(ConflictError):
    code = ErrorCode.STALE_REVISION

    def __init__(self, run_id: str, expected: int) -> None:
        self.run_id = run_id
        self.expected = expected
        super().__init__(f"run {run_id} is no longer at revision {expected}")


class LeaseLost(ConflictError):
    code = ErrorCode.LEASE_LOST

    def __init__(self, run_id: str, fencing_token: int) -> None:
        self.run_id = run_id
        self.fencing_token = fencing_token
        super().__init__(f"run {run_id}: fencing token {fencing_token} is no longer current")


class DomainError(LongrunError):
    """A business rule said no; recorded on the run."""


class IllegalTransition(DomainError):
    code = ErrorCode.ILLEGAL_TRANSITION

    def __init__(self, machine: str, from_state: str, to_state: str, why: str | None = None) -> None:
        self.machine = machine
        self.from_state = from_state
        self.to_state = to_state
        super().__init__(f"illegal {machine} transition {from_state} -> {to_state}" + (f": {why}" if why else ""))


class BudgetExhausted(DomainError):
    code = ErrorCode.BUDGET_EXHAUSTED

    def __init__(self, budget: str, used: float, limit: float) -> None:
        self.budget = budget
        self.used = used
        self.limit = limit
        super().__init__(f"budget {budget} exhausted: {used} of {limit}")


class IdempotencyKeyReused(DomainError):
    code = ErrorCode.IDEMPOTENCY_KEY_REUSED

    def __init__(self, key: str, recorded_hash: str, offered_hash: str) -> None:
        self.key = key
        self.recorded_hash = recorded_hash
        self.offered_hash = offered_hash
        super().__init__(
            f"idempotency key {key!r} was used with request hash {recorded_hash}, "
            f"refusing request hash {offered_hash}"
        )


class EventRejected(DomainError):
    """The event does not apply to the run as it stands (or would break an invariant); nothing changed."""

    code = ErrorCode.EVENT_REJECTED

    def __init__(self, run_id: str, event_type: str, reasons: tuple[str, ...]) -> None:
        self.run_id = run_id
        self.event_type = event_type
        self.reasons = reasons
        super().__init__(f"run {run_id}: {event_type} rejected: {'; '.join(reasons)}")


class ToolRejected(DomainError):
    """The tool answered with a definite refusal (4xx): nothing was done, retrying won't help."""

    code = ErrorCode.TOOL_REJECTED

    def __init__(self, tool: str, status: int, detail: str) -> None:
        self.tool = tool
        self.status = status
        self.detail = detail
        super().__init__(f"{tool} rejected the request ({status}): {detail}")


class ActionOutcomeUnknown(LongrunError):
    """The far side may have acted (timeout, dropped connection): UNKNOWN, never FAILED."""

    code = ErrorCode.ACTION_OUTCOME_UNKNOWN

    def __init__(self, tool: str, idempotency_key: str, cause: str) -> None:
        self.tool = tool
        self.idempotency_key = idempotency_key
        self.cause = cause
        super().__init__(f"outcome of {tool} ({idempotency_key}) is unknown: {cause}")


class CallTimedOut(TimeoutError):
    """A tool call watched by its timeouts ran out of one: ``start_to_close`` (no answer within the
    call's limit) or ``heartbeat`` (no heartbeat within it). A write's outcome is then UNKNOWN; a pure
    or read call is tried again under its retry policy (``non_retryable_error_types`` may name
    ``CallTimedOut`` or ``TimeoutError``)."""

    def __init__(self, kind: str, seconds: float) -> None:
        self.kind = kind
        self.seconds = seconds
        what = "no answer" if kind == "start_to_close" else "no heartbeat"
        super().__init__(f"{kind}: {what} within {seconds:g}s")
