"""Run events: the facts a run's history is made of, and their JSON form.

Responsibility: one frozen dataclass per event type (child runs' in ``child_events``), each naming its
``type`` string, plus ``event_to_dict``/``event_from_dict`` for storage (run_events.data) and the bus.

Invariants:
- Events are immutable facts. A run's history is append-only; corrections are new events.
- ``seq`` is the event's position in its run's history (1, 2, ...), assigned by storage;
  ``at`` is when its writer observed it (epoch seconds). Causality comes from seq and
  revision, never from comparing ``at`` across writers.
- ``event_from_dict(event_to_dict(e)) == e``; an unknown ``type`` is refused, not guessed.
- How each event changes a snapshot is defined only in ``longrun.domain.evolve``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from types import MappingProxyType
from typing import ClassVar, cast

from longrun.domain.action import ActionStatus, EffectKind
from longrun.domain.budget import Usage
from longrun.domain.child_events import ChildEnded, ChildStarted
from longrun.domain.codec import FrozenMap, JsonValue, from_plain, to_plain
from longrun.domain.event_base import RunEvent
from longrun.domain.event_base import event as _event
from longrun.domain.run import RunStatus
from longrun.domain.scope import Scope
from longrun.domain.snapshot import PinnedVersions, RunTimeouts, Wait, WakeReason


@_event
class RunCreated(RunEvent):
    type: ClassVar[str] = "run.created"
    run_id: str
    tenant_id: str
    kind: str
    goal: FrozenMap
    versions: PinnedVersions
    budget: Usage
    """The limits; nothing is used yet."""
    priority: int = 0
    permissions: Scope | None = None
    """The run's scope (``scope.narrow``); None in runs created before scopes existed."""
    deadline: float | None = None
    """The business deadline (epoch seconds): a ``business_deadline`` timer then sends the run cancelling
    for it (``run.deadline_passed``), and it ends TIMED_OUT."""
    timeouts: RunTimeouts = RunTimeouts()
    """Schedule-to-start and start-to-close: the producer's, else the run kind's defaults."""
    stage: str = ""
    labels: FrozenMap = FrozenMap()
    correlation_id: str | None = None
    """The producer's correlation id (its idempotency key when it gave none): every broadcast carries it."""


@_event
class RunStatusChanged(RunEvent):
    """A move with no payload of its own: take, yield, escalate, fail, time out, finish cancelling."""

    type: ClassVar[str] = "run.status_changed"
    to: RunStatus
    reason: str


@_event
class WaitStarted(RunEvent):
    type: ClassVar[str] = "run.wait_started"
    status: RunStatus
    wait: Wait


@_event
class RunWoken(RunEvent):
    type: ClassVar[str] = "run.woken"
    wait_id: str
    reason: WakeReason
    correlation_key: str | None = None


@_event
class ApprovalDecided(RunEvent):
    type: ClassVar[str] = "run.approval_decided"
    approval_id: str
    approved: bool
    approved_hash: str
    """The hash the approver saw; it must equal the pending wait's hash."""
    decided_by: str


@_event
class WaitReminded(RunEvent):
    """A reminder of the approval or question the run waits on came due (``Wait.reminders``): its
    owner is notified on the bus (``run.notice``). Changes nothing but the history."""

    type: ClassVar[str] = "run.wait_reminded"
    wait_id: str
    reminder: int
    """Which of the wait's reminders: 1 for the first."""


@_event
class WaitEscalated(RunEvent):
    """The approval or question the run waits on was escalated (``Wait.escalate_after``): from now on
    ``to`` may decide or answer it too, and is notified on the bus (``run.notice``)."""

    type: ClassVar[str] = "run.wait_escalated"
    wait_id: str
    to: str


@_event
class ApprovalExpired(RunEvent):
    """A decision on an approval was older than the validity the approval declared when the run resumed,
    and no call had used it yet: the decision (the fact ``approval.<approval_id>``) is withdrawn, so the
    run's ``decide`` asks again. The decision stays in the history as it was made."""

    type: ClassVar[str] = "run.approval_expired"
    approval_id: str
    decided_at: float
    valid_until: float


@_event
class CancelRequested(RunEvent):
    type: ClassVar[str] = "run.cancel_requested"
    by: str
    reason: str


@_event
class DeadlinePassed(RunEvent):
    """The run's business deadline passed while it was open: it enters the cancel protocol for it
    (CANCELLING, ``cancel_requested``: no new action starts, a submitted call's outcome is reconciled,
    declared compensations run) and ends TIMED_OUT, not CANCELLED."""

    type: ClassVar[str] = "run.deadline_passed"
    reason: str


@_event
class RunPaused(RunEvent):
    type: ClassVar[str] = "run.paused"
    by: str
    reason: str


@_event
class RunResumed(RunEvent):
    type: ClassVar[str] = "run.resumed"
    by: str
    reason: str


@_event
class RunTerminated(RunEvent):
    type: ClassVar[str] = "run.terminated"
    by: str
    reason: str


@_event
class RunCompleted(RunEvent):
    type: ClassVar[str] = "run.completed"
    evidence: FrozenMap
    unmet: tuple[str, ...] = ()
    """Acceptance conditions not met; must be empty for the run to complete."""


@_event
class StageChanged(RunEvent):
    type: ClassVar[str] = "run.stage_changed"
    stage: str


@_event
class VersionsMigrated(RunEvent):
    type: ClassVar[str] = "run.versions_migrated"
    versions: PinnedVersions
    by: str
    reason: str


@_event
class PatchTaken(RunEvent):
    """The run's ``decide`` took a patch point (``ctx.patched``) for the first time; its later
    decisions take it too. Written with the first decision it changed, before that decision's events,
    so a replay of the history answers ``patched`` as the run did."""

    type: ClassVar[str] = "run.patch_taken"
    patch: str
    workflow_version: str
    """The workflow version the run was pinned to when it took the patch."""


@_event
class PermissionDenied(RunEvent):
    """A call ``decide`` asked for is outside the run's scope: refused before it was prepared (the
    tool was not called, nothing is on the ledger) and never retried. What follows is the run kind's
    choice: NEEDS_ATTENTION, or a person's approval of exactly this request."""

    type: ClassVar[str] = "run.permission_denied"
    logical_action: str
    tool: str
    resource: str | None
    """What the tool acts on, as its declaration reads it from the arguments; None if it declares none."""
    request_hash: str
    reason: str
    """Names the tool or resource and the scope it is outside of."""


@_event
class FactRecorded(RunEvent):
    type: ClassVar[str] = "fact.recorded"
    key: str
    value: JsonValue
    source: str


@_event
class QuestionOpened(RunEvent):
    """A worker's step asks a person (``AskUser``); the run's wait for the answer follows in the same step."""

    type: ClassVar[str] = "question.opened"
    question_id: str
    text: str
    answer_schema: FrozenMap
    """The JSON Schema (draft 2020-12) an answer must satisfy."""


@_event
class QuestionResolved(RunEvent):
    """A person answered the open question the run waits for: the answer, checked against the
    question's schema before it was written, becomes the fact ``answer:<question_id>`` and ends the wait."""

    type: ClassVar[str] = "question.resolved"
    question_id: str
    answer: JsonValue
    answered_by: str


@_event
class SignalReceived(RunEvent):
    """A producer or operator sent the run a named signal, its payload checked against the schema the
    run's kind declares for that name before it was written. It becomes the fact ``signal:<signal_id>``
    and ends a wait for a signal of that name (``longrun.domain.signals``); after the run ended it is
    kept in the history and not applied."""

    type: ClassVar[str] = "signal.received"
    signal_id: str
    name: str
    payload: JsonValue
    sent_by: str
    """``operator:<subject>`` or ``producer:<broker user>``."""


@_event
class RunJoined(RunEvent):
    """A fan-out's join was satisfied (``CallTools``), every call it made being recorded: the checkpoint
    ``decide`` goes on from. ``by`` are the calls whose outcomes satisfied it, in the order they were
    recorded; the other calls of ``calls`` lost it (a loser in doubt no longer holds the run back). It
    becomes the fact ``joined:<join>`` (``domain.joins``)."""

    type: ClassVar[str] = "run.joined"
    join: str
    calls: tuple[str, ...]
    by: tuple[str, ...]


@_event
class BudgetCharged(RunEvent):
    type: ClassVar[str] = "budget.charged"
    model_calls: int = 0
    tool_calls: int = 0
    cost: float = 0.0
    tokens: int = 0
    """Model tokens (input and output) the charge is for, charged to the tenant's budget period; 0 in
    histories recorded before tenants had budgets."""


@_event
class RunSummarized(RunEvent):
    """What a finished run did (``closure.summarize``), recorded with the transition that ended it."""

    type: ClassVar[str] = "run.summary"
    summary: FrozenMap


@_event
class StepFailed(RunEvent):
    """The run kind's own code raised (``decide``, or ``accept`` on a completion): the error is recorded
    with how many steps in a row failed (``attempt``), and the run waits ``retry`` (a timer's wait:
    RETRY_SCHEDULED) for its next attempt, or, with no ``retry`` (its attempts used up), goes
    NEEDS_ATTENTION until an operator retries it."""

    type: ClassVar[str] = "run.step_failed"
    phase: str
    """``decide`` or ``accept``: which of the kind's functions raised."""
    error_type: str
    message: str
    attempt: int
    retry: Wait | None = None


@_event
class CorrectionNeeded(RunEvent):
    """An outcome that arrived after the run COMPLETED contradicts what it did: recorded on the
    finished run for a person to correct, never written over its history."""

    type: ClassVar[str] = "run.correction_needed"
    logical_action: str
    reason: str
    evidence: FrozenMap = FrozenMap()


@_event
class CleanupRecorded(RunEvent):
    """One attempt of one of a finished run's cleanup steps (``domain.cleanup``): ``outcome`` "done"
    (with the far side's id for what it released) or "failed" (with why; it is retried). Recorded on
    the finished run, never changing how it ended."""

    type: ClassVar[str] = "run.cleanup"
    step: str
    outcome: str
    attempt: int
    error: str = ""
    external_id: str | None = None


@_event
class ActionEvent(RunEvent):
    logical_action: str


@_event
class ActionRequest(ActionEvent):
    """What a call asks for: the fields an action is prepared with."""

    tool: str
    tool_version: str
    effect_kind: EffectKind
    idempotency_key: str
    request_hash: str
    approval_id: str | None = None
    """Set when the request needs approval: the approval must cover exactly ``request_hash``."""


@_event
class ActionPrepared(ActionRequest):
    type: ClassVar[str] = "action.prepared"


@_event
class ActionRecorded(ActionRequest):
    """A pure or read call recorded with its answer, in one event: prepared, submitted, charged one
    tool call and confirmed, its receipt kept as the fact ``receipt:<logical_action>``. Folds as
    ``action.prepared``, ``action.submitted``, ``budget.charged``, ``action.confirmed`` and
    ``fact.recorded`` would, in that order; nothing of the call is on record before its answer,
    because such a call may simply run again."""

    type: ClassVar[str] = "action.recorded"
    external_id: str | None = None
    receipt_ref: str | None = None
    receipt: JsonValue = None


def request_of(event: ActionRequest) -> dict[str, object]:
    """The request's fields of ``event`` (not its seq and time), to make another event of the same request."""
    return {f.name: getattr(event, f.name) for f in fields(ActionRequest) if f.name not in ("seq", "at")}


@_event
class ActionSubmitted(ActionEvent):
    type: ClassVar[str] = "action.submitted"


@_event
class ActionConfirmed(ActionEvent):
    type: ClassVar[str] = "action.confirmed"
    external_id: str | None = None
    receipt_ref: str | None = None


@_event
class ActionFailed(ActionEvent):
    """The far side definitely rejected the request. Never used for a timeout."""

    type: ClassVar[str] = "action.failed"
    error: str


@_event
class ActionUnavailable(ActionEvent):
    """The far side answered that it is unavailable and did not act, or a pure or read call got no
    answer (asking again changes nothing): the action is RETRYABLE, and its next attempt (a new
    submission, charged) waits for the retry policy's delay or for the far side to be healthy again."""

    type: ClassVar[str] = "action.unavailable"
    cause: str


@_event
class ActionUnknown(ActionEvent):
    type: ClassVar[str] = "action.unknown"
    cause: str


@_event
class ReconciliationStarted(ActionEvent):
    type: ClassVar[str] = "action.reconciliation_started"


@_event
class ActionReconciled(ActionEvent):
    type: ClassVar[str] = "action.reconciled"
    outcome: ActionStatus
    """CONFIRMED, RETRYABLE, NEEDS_ATTENTION, or UNKNOWN when the far side cannot tell yet."""
    external_id: str | None = None
    receipt_ref: str | None = None
    note: str = ""


@_event
class ActionResolved(ActionEvent):
    """An operator settles an action reconciliation escalated, or retries one that FAILED (RETRYABLE)."""

    type: ClassVar[str] = "action.resolved"
    outcome: ActionStatus
    by: str
    reason: str
    external_id: str | None = None
    receipt_ref: str | None = None


@_event
class CompensationStarted(ActionEvent):
    type: ClassVar[str] = "action.compensation_started"


@_event
class ActionCompensated(ActionEvent):
    type: ClassVar[str] = "action.compensated"
    receipt_ref: str | None = None


EVENT_TYPES: Mapping[str, type[RunEvent]] = MappingProxyType(
    {
        cls.type: cls
        for cls in (
            RunCreated, RunStatusChanged, WaitStarted, RunWoken, ApprovalDecided, WaitReminded, WaitEscalated,
            ApprovalExpired,
            CancelRequested, DeadlinePassed, RunPaused, RunResumed, RunTerminated, RunCompleted,
            StageChanged, VersionsMigrated, PatchTaken, PermissionDenied, FactRecorded, QuestionOpened,
            QuestionResolved, SignalReceived, ChildStarted, ChildEnded, RunJoined, StepFailed,
            BudgetCharged, ActionPrepared, ActionRecorded, ActionSubmitted, ActionConfirmed, ActionFailed,
            ActionUnavailable, ActionUnknown, ReconciliationStarted, ActionReconciled, ActionResolved,
            CompensationStarted, ActionCompensated, RunSummarized, CorrectionNeeded, CleanupRecorded,
        )  # fmt: skip
    }
)


def event_to_dict(event: RunEvent) -> dict[str, object]:
    """JSON-compatible form: ``{"type": ..., "seq": ..., "at": ..., <fields>}``."""
    return {"type": event.type, **cast(dict[str, object], to_plain(event))}


def event_from_dict(data: Mapping[str, object]) -> RunEvent:
    """Inverse of ``event_to_dict``; ValueError for an unknown type."""
    type_ = data.get("type")
    cls = EVENT_TYPES.get(type_) if isinstance(type_, str) else None
    if cls is None:
        raise ValueError(f"unknown run event type {type_!r}")
    fields_ = {k: v for k, v in data.items() if k != "type"}
    if cls is RunCreated and fields_.get("permissions") == []:
        # Stored before scopes existed, when ``permissions`` was a list nothing set: no scope.
        del fields_["permissions"]
    return from_plain(cls, fields_)
