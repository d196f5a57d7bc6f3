"""How run-level events change a snapshot: lifecycle, waits, control, facts, budget.

Responsibility: the handlers ``evolve`` dispatches run-level events to, and the checked
status move every handler uses. Handlers assume ``evolve`` has already dealt with late
events, finished runs and seq order, and that it verifies invariants on the result.

Invariants:
- Every status change goes through ``move``, hence through ``check_run_transition``;
  leaving a status drops its wait and pause bookkeeping.
- Statuses that need data (waits, pause, cancel, completion, termination) are entered
  only through their own event (``OWN_EVENT``), never through ``run.status_changed``.
- A wait ends only by a wake, an approval, an answer, a signal, or a move imposed from outside the step.
- A question is open only while the run waits for its answer (a worker's step opens it just
  before that wait): however the wait ends (answer, deadline, cancel...), the question closes
  with it; a pause keeps both.
- A run cancelling for its business deadline (``run.deadline_passed``) ends TIMED_OUT, one cancelled by
  an operator CANCELLED (``timeouts.cancel_end``); the other end is refused naming both states.
- A pause remembers what it paused; a wake while paused changes what the run resumes to,
  not the pause itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from longrun.domain import events as ev
from longrun.domain.budget import Budget, charge, over_limit
from longrun.domain.codec import FrozenMap
from longrun.domain.run import OPEN, TERMINAL, WAITING, RunStatus, check_run_transition
from longrun.domain.snapshot import (
    ANSWER_FACT_PREFIX,
    APPROVAL_FACT_PREFIX,
    APPROVAL_VALID_UNTIL,
    DENIED_FACT_PREFIX,
    Acceptance,
    Fact,
    Question,
    RunSnapshot,
    StepFailure,
    Wait,
    Wake,
    WakeReason,
)
from longrun.domain.timeouts import cancel_end, cancel_refusal, on_business_deadline
from longrun.errors import BudgetExhausted, EventRejected, IllegalTransition

_S = RunStatus

Handler = Callable[[RunSnapshot, Any], RunSnapshot]

# Statuses entered only through their own event, which carries what the status needs.
OWN_EVENT: Mapping[RunStatus, str] = {
    _S.WAITING_EVENT: ev.WaitStarted.type,
    _S.WAITING_USER: ev.WaitStarted.type,
    _S.RETRY_SCHEDULED: ev.WaitStarted.type,
    _S.PAUSED: ev.RunPaused.type,
    _S.CANCELLING: ev.CancelRequested.type,
    _S.COMPLETED: ev.RunCompleted.type,
    _S.TERMINATED: ev.RunTerminated.type,
}


def reject(state: RunSnapshot, event: ev.RunEvent, reason: str) -> NoReturn:
    raise EventRejected(state.run_id, event.type, (reason,))


def move(state: RunSnapshot, to: RunStatus, at: float, *, reason: str | None = None) -> RunSnapshot:
    """A checked status move; leaving a status drops its wait and pause bookkeeping."""
    check_run_transition(state.status, to)
    moved = state.replace(
        status=to,
        status_since=at,
        wait=None,
        paused_from=None,
        terminal_reason=reason if to in TERMINAL else None,
    )
    if state.wait is not None and state.wait.question_id is not None:
        return moved.replace(open_questions=_still_open(state))
    return moved


def _still_open(s: RunSnapshot) -> tuple[Question, ...]:
    """The open questions once the pending wait ends: all but the one it waited on."""
    waited = s.wait.question_id if s.wait is not None else None
    return tuple(q for q in s.open_questions if q.question_id != waited)


def created(e: ev.RunCreated) -> RunSnapshot:
    return RunSnapshot(
        run_id=e.run_id, tenant_id=e.tenant_id, kind=e.kind, status=_S.READY, revision=1,
        last_seq=e.seq, created_at=e.at, status_since=e.at, goal=e.goal, versions=e.versions,
        budget=Budget(limit=e.budget), priority=e.priority, permissions=e.permissions,
        deadline=e.deadline, timeouts=e.timeouts, stage=e.stage, labels=e.labels, correlation_id=e.correlation_id,
    )  # fmt: skip


def _status_changed(s: RunSnapshot, e: ev.RunStatusChanged) -> RunSnapshot:
    own = OWN_EVENT.get(e.to)
    if own is not None:
        reject(s, e, f"{e.to.value} is entered with {own}")
    if e.to in OPEN and s.status in WAITING | {_S.PAUSED}:
        reject(s, e, f"{s.status.value} ends with run.woken, run.approval_decided or run.resumed")
    if s.status is _S.CANCELLING and e.to in (_S.CANCELLED, _S.TIMED_OUT):
        end, _ = cancel_end(s)
        if e.to is not end:
            why = "its business deadline" if s.deadline_passed else "a cancel request"
            raise IllegalTransition("run", s.status.value, e.to.value, f"the run is cancelling for {why}: it ends "
                                                                       f"{end.value}")
    moved = move(s, e.to, e.at, reason=e.reason)
    if s.status is _S.NEEDS_ATTENTION and e.to is _S.READY:
        return moved.replace(failure=None)  # a person sent it back to work: failed steps count anew
    return moved


def _wait_started(s: RunSnapshot, e: ev.WaitStarted) -> RunSnapshot:
    if s.status is not _S.RUNNING:
        reject(s, e, f"only a worker step starts a wait; the run is {s.status.value}")
    if e.status not in WAITING:
        reject(s, e, f"{e.status.value} is not a waiting status")
    if e.wait.deadline is not None and e.wait.deadline < e.at:
        reject(s, e, f"deadline {e.wait.deadline} has already passed at {e.at}")
    return move(s, e.status, e.at).replace(wait=e.wait)


def _parked(s: RunSnapshot) -> RunStatus:
    return s.paused_from if s.paused_from is not None else s.status


def _pending_wait(s: RunSnapshot, e: ev.RunEvent) -> Wait:
    if s.wait is None:
        reject(s, e, "no wait is pending")
    return s.wait


def end_wait(s: RunSnapshot, at: float, wake: Wake) -> RunSnapshot:
    """A wake readies the run; while paused it readies what the run will resume to."""
    if s.status is _S.PAUSED:
        check_run_transition(_parked(s), _S.READY)
        return s.replace(paused_from=_S.READY, wait=None, last_wake=wake, open_questions=_still_open(s))
    return move(s, _S.READY, at).replace(last_wake=wake)


def _woken(s: RunSnapshot, e: ev.RunWoken) -> RunSnapshot:
    wait = _pending_wait(s, e)
    if e.reason is WakeReason.APPROVAL:
        reject(s, e, f"approvals arrive as {ev.ApprovalDecided.type}")
    matches = wait.correlation_key is not None and e.correlation_key == wait.correlation_key
    if e.reason is WakeReason.EVENT and not matches:
        reject(s, e, f"correlation key {e.correlation_key!r} is not the wait's {wait.correlation_key!r}")
    if e.reason is WakeReason.TIMER and wait.wake_at is None:
        reject(s, e, "the pending wait has no timer")
    return end_wait(s, e.at, Wake(e.reason, wait.wait_id, e.at, e.correlation_key))


def _approval_decided(s: RunSnapshot, e: ev.ApprovalDecided) -> RunSnapshot:
    wait = _pending_wait(s, e)
    if _parked(s) is not _S.WAITING_USER:
        reject(s, e, "the run is not waiting for a user")
    if e.approved_hash != wait.approved_hash:
        reject(s, e, f"the decision covers {e.approved_hash}, the pending request is {wait.approved_hash}")
    validity = {} if wait.valid_for is None else {APPROVAL_VALID_UNTIL: e.at + wait.valid_for}
    decision = FrozenMap(
        {"approved": e.approved, "approved_hash": e.approved_hash, "decided_by": e.decided_by, **validity}
    )
    fact = Fact(APPROVAL_FACT_PREFIX + e.approval_id, decision, f"user:{e.decided_by}", e.at)
    return end_wait(put_fact(s, fact), e.at, Wake(WakeReason.APPROVAL, wait.wait_id, e.at))


def _cancel_requested(s: RunSnapshot, e: ev.CancelRequested) -> RunSnapshot:
    refused = cancel_refusal(s)
    if refused is not None:
        raise IllegalTransition("run", s.status.value, _S.CANCELLING.value, refused)
    return move(s, _S.CANCELLING, e.at).replace(cancel_requested=True)


def _deadline_passed(s: RunSnapshot, e: ev.DeadlinePassed) -> RunSnapshot:
    verdict = on_business_deadline(s)
    if not verdict.cancel:
        reject(s, e, f"the deadline changes nothing: {verdict.why}")
    # A pause is lifted: the protocol needs a worker, as an operator's cancel of a paused run does.
    return move(s, _S.CANCELLING, e.at).replace(cancel_requested=True, deadline_passed=True)


def _paused(s: RunSnapshot, e: ev.RunPaused) -> RunSnapshot:
    return move(s, _S.PAUSED, e.at).replace(paused_from=s.status, wait=s.wait, open_questions=s.open_questions)


def _resumed(s: RunSnapshot, e: ev.RunResumed) -> RunSnapshot:
    if s.status is not _S.PAUSED:
        reject(s, e, f"the run is {s.status.value}, not PAUSED")
    # The worker that was running the run lost it to the revision bump: schedule it again.
    target = _S.READY if _parked(s) is _S.RUNNING else _parked(s)
    resumed = move(s, target, e.at)
    return resumed.replace(wait=s.wait, open_questions=s.open_questions) if target in WAITING else resumed


def _terminated(s: RunSnapshot, e: ev.RunTerminated) -> RunSnapshot:
    return move(s, _S.TERMINATED, e.at, reason=f"terminated by {e.by}: {e.reason}")


def _completed(s: RunSnapshot, e: ev.RunCompleted) -> RunSnapshot:
    done = move(s, _S.COMPLETED, e.at, reason="acceptance check passed")
    return done.replace(acceptance=Acceptance(e.evidence, e.unmet))


def _patch_taken(s: RunSnapshot, e: ev.PatchTaken) -> RunSnapshot:
    if s.status is not _S.RUNNING:
        reject(s, e, f"only a worker's decision takes a patch; the run is {s.status.value}")
    return s.replace(patches=(*s.patches, e.patch))


def _permission_denied(s: RunSnapshot, e: ev.PermissionDenied) -> RunSnapshot:
    if s.status is not _S.RUNNING:
        reject(s, e, f"only a worker's step is refused a call; the run is {s.status.value}")
    refused = FrozenMap({"tool": e.tool, "resource": e.resource, "request_hash": e.request_hash, "reason": e.reason})
    return put_fact(s, Fact(DENIED_FACT_PREFIX + e.logical_action, refused, "runtime", e.at))


def put_fact(s: RunSnapshot, fact: Fact) -> RunSnapshot:
    return s.replace(facts=(*(f for f in s.facts if f.key != fact.key), fact))


def _question_opened(s: RunSnapshot, e: ev.QuestionOpened) -> RunSnapshot:
    if s.status is not _S.RUNNING:
        reject(s, e, f"only a worker step asks a question; the run is {s.status.value}")
    if s.open_questions:
        reject(s, e, f"question {s.open_questions[0].question_id!r} is already open")
    if s.fact(ANSWER_FACT_PREFIX + e.question_id) is not None:
        reject(s, e, f"question {e.question_id!r} was answered before: a new question needs a new id")
    return s.replace(open_questions=(Question(e.question_id, e.text, e.answer_schema),))


def _question_resolved(s: RunSnapshot, e: ev.QuestionResolved) -> RunSnapshot:
    wait = _pending_wait(s, e)
    if wait.question_id != e.question_id:
        reject(s, e, f"the run does not wait for an answer to question {e.question_id!r}")
    answer = Fact(ANSWER_FACT_PREFIX + e.question_id, e.answer, f"user:{e.answered_by}", e.at)
    return end_wait(put_fact(s, answer), e.at, Wake(WakeReason.ANSWER, wait.wait_id, e.at))


def _step_failed(s: RunSnapshot, e: ev.StepFailed) -> RunSnapshot:
    """The kind's code raised in a worker's step: the run retries on a timer, or gives up to a person."""
    if s.status is not _S.RUNNING:
        reject(s, e, f"only a worker's step fails; the run is {s.status.value}")
    previous = s.failure.attempt if s.failure is not None else 0
    if e.attempt != previous + 1:
        reject(s, e, f"attempt {e.attempt} does not follow the {previous} failed in a row before it")
    failure = StepFailure(e.phase, e.error_type, e.message, e.attempt, e.at)
    if e.retry is None:
        reason = f"{e.phase} raised {e.attempt} times in a row, last {e.error_type}: {e.message}"
        return move(s, _S.NEEDS_ATTENTION, e.at, reason=reason).replace(failure=failure)
    if e.retry.deadline is not None and e.retry.deadline < e.at:
        reject(s, e, f"the retry's deadline {e.retry.deadline} has already passed at {e.at}")
    return move(s, _S.RETRY_SCHEDULED, e.at).replace(wait=e.retry, failure=failure)


def _budget_charged(s: RunSnapshot, e: ev.BudgetCharged) -> RunSnapshot:
    if e.model_calls < 0 or e.tool_calls < 0 or e.cost < 0 or e.tokens < 0:
        reject(s, e, "charges are non-negative")
    return apply_charge(s, e.at, model_calls=e.model_calls, tool_calls=e.tool_calls, cost=e.cost)


def apply_charge(s: RunSnapshot, at: float, *, model_calls: int = 0, tool_calls: int = 0,
                 cost: float = 0.0) -> RunSnapshot:
    charged = s.replace(budget=charge(s.budget, model_calls=model_calls, tool_calls=tool_calls, cost=cost))
    over = over_limit(charged.budget)
    if not over:
        return charged
    # Work already in flight overran the budget: the run ends here, wherever it was.
    used, limit = getattr(charged.budget.used, over[0]), getattr(charged.budget.limit, over[0])
    return move(charged, _S.BUDGET_EXHAUSTED, at, reason=BudgetExhausted(over[0], used, limit).message)


HANDLERS: Mapping[type[ev.RunEvent], Handler] = {
    ev.RunStatusChanged: _status_changed,
    ev.WaitStarted: _wait_started,
    ev.RunWoken: _woken,
    ev.ApprovalDecided: _approval_decided,
    ev.CancelRequested: _cancel_requested,
    ev.DeadlinePassed: _deadline_passed,
    ev.RunPaused: _paused,
    ev.RunResumed: _resumed,
    ev.RunTerminated: _terminated,
    ev.RunCompleted: _completed,
    ev.StageChanged: lambda s, e: s.replace(stage=e.stage),
    ev.VersionsMigrated: lambda s, e: s.replace(versions=e.versions),
    ev.PatchTaken: _patch_taken,
    ev.PermissionDenied: _permission_denied,
    ev.FactRecorded: lambda s, e: put_fact(s, Fact(e.key, e.value, e.source, e.at)),
    ev.QuestionOpened: _question_opened,
    ev.QuestionResolved: _question_resolved,
    ev.BudgetCharged: _budget_charged,
    ev.StepFailed: _step_failed,
}
