"""Payload models, one per (type, schema_version). Published contract: see schemas/.

A new version is a new class plus an upcaster from the previous one (``upcast.py``);
an old class stays as long as producers may still send it.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, Field

from longrun_client.model import Strict


class BudgetLimits(Strict):
    model_calls: int = Field(default=50, ge=0)
    tool_calls: int = Field(default=200, ge=0)
    cost_usd: float = Field(default=10.0, ge=0)


class RunCreateV1(Strict):
    """Legacy form: a single cost ceiling."""

    workflow: str = Field(min_length=1)
    idempotency_key: str = Field(min_length=1, max_length=200)
    input: dict[str, Any] = Field(default_factory=dict)
    priority: int = Field(default=5, ge=0, le=9)
    budget_usd: float = Field(default=10.0, ge=0)


class RunCreateV2(Strict):
    """Ask the scheduler to create a run; the same (tenant, idempotency_key) yields one run."""

    workflow: str = Field(min_length=1, description="Run kind, e.g. dependency_upgrade.")
    idempotency_key: str = Field(min_length=1, max_length=200)
    input: dict[str, Any] = Field(default_factory=dict, description="The goal and its parameters.")
    priority: int = Field(default=5, ge=0, le=9, description="0 lowest, 9 highest; aging lifts waiting runs.")
    budget: BudgetLimits = Field(default_factory=BudgetLimits)
    workflow_version: str | None = Field(default=None, description="Pin; the newest registered when absent.")
    labels: dict[str, str] = Field(default_factory=dict)


SCOPE_PATTERN = r"^[^*]+\*?$|^\*$"
"""A name, or a prefix ending in ``*`` (``*`` alone: everything)."""


class RunScope(Strict):
    """What the run may use, at most: it narrows what the run kind and the tenant's policy allow and
    never widens it (a pattern beyond them is dropped, not granted)."""

    tools: list[Annotated[str, Field(pattern=SCOPE_PATTERN)]] | None = Field(
        default=None, description="Tool names or prefixes ending in '*'; absent: no narrowing.")
    resources: list[Annotated[str, Field(pattern=SCOPE_PATTERN)]] | None = Field(
        default=None, description="What tools act on (e.g. 'repo:acme/web', 'repo:acme/*'); absent: no narrowing.")


class RunCreateV3(Strict):
    """Ask the scheduler to create a run; the same (tenant, idempotency_key) yields one run."""

    workflow: str = Field(min_length=1, description="Run kind, e.g. dependency_upgrade.")
    idempotency_key: str = Field(min_length=1, max_length=200)
    input: dict[str, Any] = Field(default_factory=dict, description="The goal and its parameters.")
    priority: int = Field(default=5, ge=0, le=9, description="0 lowest, 9 highest; aging lifts waiting runs.")
    budget: BudgetLimits = Field(default_factory=BudgetLimits)
    workflow_version: str | None = Field(default=None, description="Pin; the newest registered when absent.")
    labels: dict[str, str] = Field(default_factory=dict)
    scope: RunScope | None = Field(default=None, description="Narrows the run's permissions; absent: none.")
    deadline: AwareDatetime | None = Field(
        default=None, description="Business deadline (RFC 3339, with offset): the run ends TIMED_OUT then if "
                                  "still open, queued time included.")


class RunTimeouts(Strict):
    """A run's own time limits, in seconds; each one absent takes the run kind's default, if any."""

    schedule_to_start: float | None = Field(
        default=None, gt=0, description="How long the run may sit queued (READY) before a worker starts it; past "
                                        "it, the run ends TIMED_OUT. Counted from each time it is queued.")
    start_to_close: float | None = Field(
        default=None, gt=0, description="A cap on every tool call's start-to-close in this run: it shortens what "
                                        "a tool declares, never lengthens it.")


class RunCreateV4(Strict):
    """Ask the scheduler to create a run; the same (tenant, idempotency_key) yields one run."""

    workflow: str = Field(min_length=1, description="Run kind, e.g. dependency_upgrade.")
    idempotency_key: str = Field(min_length=1, max_length=200)
    input: dict[str, Any] = Field(default_factory=dict, description="The goal and its parameters.")
    priority: int = Field(default=5, ge=0, le=9, description="0 lowest, 9 highest; aging lifts waiting runs.")
    budget: BudgetLimits = Field(default_factory=BudgetLimits)
    workflow_version: str | None = Field(default=None, description="Pin; the newest registered when absent.")
    labels: dict[str, str] = Field(default_factory=dict)
    scope: RunScope | None = Field(default=None, description="Narrows the run's permissions; absent: none.")
    deadline: AwareDatetime | None = Field(
        default=None, description="Business deadline (RFC 3339, with offset), queued time included: if the run "
                                  "is still open then, it is cancelled for it (no new action starts, declared "
                                  "compensations run) and ends TIMED_OUT.")
    timeouts: RunTimeouts | None = Field(
        default=None, description="Schedule-to-start and start-to-close limits; absent: the run kind's defaults.")


class RunWakeupV1(Strict):
    """Work message: the run to advance; all state is read from PostgreSQL."""

    wakeup_id: str = Field(min_length=1)
    reason: str = Field(min_length=1)


class RunEventV1(Strict):
    """Version 1 of a run's status broadcast (before labels and outcomes); upcast to v2 on read."""

    seq: int = Field(ge=1)
    event_type: str
    status: str
    data: dict[str, Any] = Field(default_factory=dict)


class PinnedVersionsV1(Strict):
    """What a run was pinned to when it was created."""

    workflow: str
    prompt: str
    model_policy: str
    tool_schemas: str


class RunAcceptedV1(Strict):
    """A run.create became (or, repeated, already was) this run. Sent in the creating transaction."""

    run_id: str
    idempotency_key: str
    workflow: str
    versions: PinnedVersionsV1
    labels: dict[str, str] = Field(default_factory=dict)
    repeated: bool = Field(default=False, description="True when the key had made this run before.")


class Acceptance(Strict):
    """The acceptance check's verdict and the evidence it passed on."""

    evidence: dict[str, Any] = Field(default_factory=dict)
    unmet: list[str] = Field(default_factory=list)


class PublicReceipt(Strict):
    """What the outside world may learn of one confirmed action: the far side's id, plus the receipt
    fields its tool declares public."""

    logical_action: str
    tool: str
    external_id: str | None = None
    fields: dict[str, Any] = Field(default_factory=dict)


class RunOutcome(Strict):
    """How a run ended: carried by its terminal event."""

    status: str
    terminal_reason: str | None = None
    acceptance: Acceptance | None = None
    receipts: list[PublicReceipt] = Field(default_factory=list)


class RunEventV2(Strict):
    """A run's status change, broadcast on the events exchange for downstream consumers."""

    seq: int = Field(ge=1, description="The run's event sequence number: order a run's events by it.")
    event_type: str
    status: str
    data: dict[str, Any] = Field(default_factory=dict, description="from (the previous status), stage, reason.")
    labels: dict[str, str] = Field(default_factory=dict)
    outcome: RunOutcome | None = Field(default=None, description="Set on the terminal event only.")


class DoneAction(Strict):
    """An action of a finished run whose effect happened, with the far side's id for it."""

    logical_action: str
    tool: str
    status: str = Field(description="CONFIRMED, COMPENSATING or COMPENSATED.")
    external_id: str | None = None


class RunUsage(Strict):
    """What a run used of its budget."""

    model_calls: int = Field(ge=0)
    tool_calls: int = Field(ge=0)
    cost: float = Field(ge=0)


class RunSummary(Strict):
    """What a finished run did, used and took: its ``run.summary``, recorded when it ended."""

    status: str
    terminal_reason: str | None = None
    done: list[DoneAction] = Field(default_factory=list)
    used: RunUsage
    duration_seconds: float = Field(ge=0, description="From the run's creation to its end.")


class RunOutcomeV3(RunOutcome):
    """How a run ended, with its summary: carried by its terminal event from run.event v3 on."""

    summary: RunSummary | None = Field(default=None, description="Null only on an event upcast from v2.")


class RunEventV3(Strict):
    """A run's status change (``run.status_changed``), or a correction a COMPLETED run needs
    (``run.correction_needed``), broadcast on the events exchange for downstream consumers."""

    seq: int = Field(ge=1, description="The run's event sequence number: order a run's events by it.")
    event_type: str = Field(description="run.status_changed or run.correction_needed.")
    status: str
    data: dict[str, Any] = Field(default_factory=dict, description=(
        "run.status_changed: from (the previous status), stage, reason. run.correction_needed: "
        "logical_action, reason, evidence."))
    labels: dict[str, str] = Field(default_factory=dict)
    outcome: RunOutcomeV3 | None = Field(default=None, description="Set on the terminal status change only.")


class RunAcceptedV2(Strict):
    """A run.create became (or, repeated, already was) this run. Sent in the creating transaction;
    answering a repeated create of a run that had already ended, it carries that run's outcome."""

    run_id: str
    idempotency_key: str
    workflow: str
    versions: PinnedVersionsV1
    labels: dict[str, str] = Field(default_factory=dict)
    repeated: bool = Field(default=False, description="True when the key had made this run before.")
    outcome: RunOutcomeV3 | None = Field(default=None, description=(
        "Set only on a repeat whose run had already ended: how it ended, as its terminal run.event said "
        "(that event is not published again)."))


class RejectionCode(str, Enum):
    """Why a run.create was refused, for machines; ``reason`` says it for people.

    The codes known to this version of the contract. run.rejected v3's ``code`` is open: a consumer
    may meet a code added later, and handles one it does not know as a refusal whose ``reason``
    says why."""

    INVALID_PAYLOAD = "invalid_payload"
    UNKNOWN_SCHEMA_VERSION = "unknown_schema_version"
    UNKNOWN_WORKFLOW = "unknown_workflow"
    UNKNOWN_WORKFLOW_VERSION = "unknown_workflow_version"
    INPUT_TOO_LARGE = "input_too_large"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    INPUT_INVALID = "input_invalid"
    TENANT_NOT_ALLOWED = "tenant_not_allowed"
    CONCURRENCY_KEY_HELD = "concurrency_key_held"


# run.rejected v2's closed list, frozen as v2 published it (its schema names it RejectionCode).
RejectionCodeV2 = Enum("RejectionCode", [  # type: ignore[misc]
    (code.name, code.value) for code in list(RejectionCode)[:6]], type=str)
RejectionCodeV2.__doc__ = "Why a run.create was refused, for machines; ``reason`` says it for people."

REJECTION_CODE_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
"""What any refusal code looks like, those added later included."""


class RunRejectedV1(Strict):
    """Version 1 of a refusal (no code); upcast to v2 on read."""

    idempotency_key: str
    reason: str
    existing_run_id: str | None = None
    recorded_input_hash: str | None = None
    offered_input_hash: str | None = None


class RunRejectedV2(Strict):
    """A run.create that was refused: a code, the reason and, for key reuse, both hashes."""

    code: RejectionCodeV2  # type: ignore[valid-type]
    reason: str
    idempotency_key: str | None = Field(default=None, description="None when the payload could not be read.")
    refused_event_id: str | None = Field(default=None, description="event_id of the refused run.create.")
    existing_run_id: str | None = None
    recorded_input_hash: str | None = None
    offered_input_hash: str | None = None


class RunRejectedV3(Strict):
    """A run.create or run.signal that was refused: a code, the reason and, for key reuse, both hashes.

    The code is open (v2's was a closed list): handle a code you do not know as a refusal whose
    reason says why; new codes need no new version."""

    code: str = Field(pattern=REJECTION_CODE_PATTERN, description=(
        "Why, for machines: one of RejectionCode's values or a code added later (lower case, digits and '_')."))
    reason: str = Field(description="Why, for people; for input_invalid it names each field that failed.")
    idempotency_key: str | None = Field(default=None, description="None when the payload could not be read.")
    refused_event_id: str | None = Field(default=None, description="event_id of the refused message.")
    existing_run_id: str | None = None
    recorded_input_hash: str | None = None
    offered_input_hash: str | None = None


class RunNoticeV1(Strict):
    """A person is asked to act on a run (an approval to decide, a question to answer), is reminded of
    it, or the request was escalated: broadcast so any notifier (mail, chat, a pager) can tell them.

    Deciding and answering go through the operator API, ``longrunctl`` or the console; a notice is
    only news. ``subject`` is the text the run kind wrote for the person (the approval's summary or
    the question's text), never the run's facts or receipts."""

    seq: int = Field(ge=1, description=(
        "The seq of the run event it announces: the wait's start (requested), the reminder or the escalation."))
    notice: Literal["requested", "reminder", "escalated"]
    wait_kind: Literal["approval", "question"]
    wait_id: str = Field(description="The wait it is about; a new request (e.g. after expiry) is a new wait.")
    approval_id: str | None = Field(default=None, description="Set for an approval.")
    approved_hash: str | None = Field(default=None, description="Set for an approval: the hash to decide on.")
    question_id: str | None = Field(default=None, description="Set for a question.")
    subject: str = Field(default="", description="What is asked: the approval's summary or the question's text.")
    owner: str | None = Field(default=None, description=(
        "Who may decide or answer: a subject, role:<role> or group:<group>; null: any approver."))
    escalated_to: str | None = Field(default=None, description=(
        "Who may decide or answer as well, since the escalation; null before it (or without one)."))
    reminder: int | None = Field(default=None, ge=1, description="On a reminder: which one (1 for the first).")
    deadline: AwareDatetime | None = Field(default=None, description=(
        "When the request closes unanswered (RFC 3339); the run then goes on as its kind decides."))
    labels: dict[str, str] = Field(default_factory=dict)


SIGNAL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$"


class SignalRejectionCode(str, Enum):
    """Why a run.signal was refused (run.rejected v3's open ``code``), for machines."""

    TENANT_NOT_ALLOWED = "tenant_not_allowed"
    RUN_NOT_FOUND = "run_not_found"
    SIGNAL_REFUSED = "signal_refused"


class RunSignalV1(Strict):
    """Send a named signal to an open run: the envelope's run_id names the run, its tenant_id the run's
    tenant. The run's kind must declare the name, and the payload must satisfy the JSON Schema it
    declares for it; the same (run, signal_id) is recorded once. Refused (run.rejected): a tenant the
    publishing broker user is not allowed (tenant_not_allowed), a run not of that tenant or unknown
    (run_not_found), a name or payload the kind refuses (signal_refused)."""

    signal_id: str = Field(min_length=1, max_length=200, description=(
        "The sender's id for this signal: sending it again (a retry) records it once and wakes the run once."))
    name: str = Field(pattern=SIGNAL_NAME_PATTERN, description="A signal the run's kind declares.")
    payload: Any = Field(default_factory=dict, description="Any JSON value the kind's schema for the name accepts.")
