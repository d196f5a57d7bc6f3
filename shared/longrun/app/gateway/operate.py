"""Operator actions on runs: approve, deny, answer, resolve an action in doubt, retry a failed action,
retry a run that needs attention, attach an artifact, cancel, pause, resume, terminate — each audited.

Every action locks the run, appends its event with the revision guard, writes the
audit row (who, what, why) in the same transaction (a ``RunTransaction``: PostgreSQL's in the
runtime, the memory store's in tests), and wakes a worker when the run has something to do.
The gateway's operator API and the CLI both call these.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from longrun import logs, otel
from longrun.app import effects, questions
from longrun.app.gateway import family
from longrun.authoring import Registry
from longrun.errors import DomainError, ErrorCode
from longrun.ports.stores import RunTransaction
from longrun.principals import Principal
from longrun.domain import (
    WAKE_A_WORKER,
    ANSWER_FACT_PREFIX,
    RECEIPT_FACT_PREFIX,
    RUN_TRANSITIONS,
    TERMINAL,
    UNRECONCILED,
    ActionRecord,
    ActionStatus,
    RunSnapshot,
    RunStatus,
    Wait,
    freeze,
    is_late,
    reminders,
    to_plain,
)
from longrun.domain import events as ev
from longrun.ports.runs import LedgerOutcome, StoredRun

PRODUCER = "operator"


class RunNotFound(LookupError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id!r}")


class NotPending(DomainError):
    """An operator decided something the run no longer asks for; say what it asks for now."""

    code = ErrorCode.ILLEGAL_TRANSITION

    def __init__(self, run_id: str, what: str, pending: str) -> None:
        super().__init__(f"run {run_id}: {what} is not pending ({pending})")


class NotMigratable(DomainError):
    """The target version does not exist here, or does not declare it can take this run over."""

    code = ErrorCode.ILLEGAL_TRANSITION

    def __init__(self, run_id: str, why: str) -> None:
        super().__init__(f"run {run_id} cannot be migrated: {why}")


class NotPermitted(DomainError):
    code = ErrorCode.ILLEGAL_TRANSITION

    def __init__(self, run_id: str, actor: str, owner: str, what: str = "decide this approval") -> None:
        super().__init__(f"run {run_id}: only {owner} may {what}, not {actor}")


class ResolutionRefused(DomainError):
    """A resolution whose evidence does not fit its outcome; nothing was recorded."""

    code = ErrorCode.EVENT_REJECTED

    def __init__(self, run_id: str, logical_action: str, why: str) -> None:
        super().__init__(f"run {run_id}: resolving {logical_action!r} refused: {why}")


class AttachmentRefused(DomainError):
    code = ErrorCode.EVENT_REJECTED

    def __init__(self, run_id: str, why: str) -> None:
        super().__init__(f"run {run_id}: attachment refused: {why}")


class AnswerRefused(DomainError):
    """An answer that does not satisfy its question's schema; nothing was recorded."""

    code = ErrorCode.EVENT_REJECTED

    def __init__(self, run_id: str, question_id: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"run {run_id}: the answer to question {question_id!r} does not satisfy its schema: "
                         + "; ".join(problems))


def allowed_operations(run: RunSnapshot) -> list[str]:
    """What an operator may do to ``run`` now, as the operator API names it (``POST /runs/{id}/<name>``):
    the decisions its wait asks for, ``resolve`` while an action is in doubt, ``retry-action`` while an
    action of a run that has not ended FAILED, ``retry`` for a run that needs attention with nothing in
    doubt, and the moves the run's state machine allows from its status."""
    moves = RUN_TRANSITIONS[run.status]
    wait = run.wait
    allowed: list[str] = []
    if run.status is RunStatus.WAITING_USER and wait is not None:
        allowed += ["answer"] if wait.question_id is not None else ["approve", "deny"] if wait.approval_id else []
    if any(a.status in UNRECONCILED for a in run.actions):
        allowed.append("resolve")
    if run.status not in TERMINAL and any(a.status is ActionStatus.FAILED for a in run.actions):
        allowed.append("retry-action")
    if _retry_refusal(run) is None:
        allowed.append("retry")
    allowed += [name for name, to in (("pause", RunStatus.PAUSED), ("cancel", RunStatus.CANCELLING),
                                      ("terminate", RunStatus.TERMINATED)) if to in moves]
    if run.status is RunStatus.PAUSED:
        allowed.append("resume")
    return allowed


async def _apply(tx: RunTransaction, run_id: str, action: str, *, actor: str, reason: str,
                 build: Callable[[int, float], ev.RunEvent], clock: Callable[[], float],
                 details: dict[str, Any] | None = None, kinds: Registry | None = None) -> dict[str, Any]:
    """``kinds``: for a run this ends, whose tools' public receipt fields its outcome shows."""
    return await _apply_to(tx, await _locked(tx, run_id), action, actor=actor, reason=reason, build=build,
                           clock=clock, details=details, kinds=kinds)


async def _locked(tx: RunTransaction, run_id: str) -> StoredRun:
    """The run with its row lock, held to commit: what is checked on it stays true until then."""
    stored = await tx.load(run_id, lock=True)
    if stored is None:
        raise RunNotFound(run_id)
    return stored


async def _apply_to(tx: RunTransaction, stored: StoredRun, action: str, *, actor: str, reason: str,
                    build: Callable[[int, float], ev.RunEvent], clock: Callable[[], float],
                    details: dict[str, Any] | None = None, kinds: Registry | None = None) -> dict[str, Any]:
    """``_apply`` on a run loaded with its lock (``_locked``)."""
    run_id = stored.snapshot.run_id
    with logs.bound(run_id, stored.snapshot.tenant_id), otel.run_span(
            f"operate {action}", stored.trace_root, attributes={
                "longrun.run_id": run_id, "longrun.tenant": stored.snapshot.tenant_id, "longrun.operator": actor,
                "longrun.operation": action}):
        return await _applied(tx, stored, action, actor=actor, reason=reason, build=build, clock=clock,
                              details=details, kinds=kinds)


async def _applied(tx: RunTransaction, stored: StoredRun, action: str, *, actor: str, reason: str,
                   build: Callable[[int, float], ev.RunEvent], clock: Callable[[], float],
                   details: dict[str, Any] | None, kinds: Registry | None) -> dict[str, Any]:
    run_id = stored.snapshot.run_id
    event = build(stored.seq(), clock())
    if is_late(stored.snapshot, event):
        # Reports from the outside world may arrive late and are kept; a person deciding on
        # something that is no longer asked is told so instead.
        wait = stored.snapshot.wait
        pending = (f"it waits for approval {wait.approval_id} of hash {wait.approved_hash}"
                   if wait is not None and wait.approval_id else f"it is {stored.snapshot.status.value}")
        raise NotPending(run_id, action, pending)
    after = await tx.append(stored, [event])
    await tx.audit(actor=actor, action=action, target=run_id, reason=reason,
                   details={"from": stored.snapshot.status.value, "to": after.snapshot.status.value, **(details or {})})
    await _publish(tx, stored, after, actor=actor, action=action, kinds=kinds)
    return {"run_id": run_id, "status": after.snapshot.status.value, "revision": after.snapshot.revision}


async def _publish(tx: RunTransaction, stored: StoredRun, after: StoredRun, *, actor: str, action: str,
                   kinds: Registry | None) -> None:
    """The change's broadcast, and a wakeup when the run has something to do."""
    run = after.snapshot
    public = effects.EXTERNAL_IDS_ONLY if kinds is None else kinds.public_receipts(run.kind, run.versions.workflow)
    broadcast = effects.broadcast_message(stored.snapshot, after, producer=PRODUCER, cause=f"operator:{actor}",
                                          public=public)
    wakeup = (effects.wake_message(after, reason=action, producer=PRODUCER, cause=f"operator:{actor}")
              if run.status in WAKE_A_WORKER else None)
    await tx.send([m for m in (broadcast, wakeup) if m is not None])


async def decide_approval(tx: RunTransaction, run_id: str, *, approval_id: str, approved_hash: str,
                          approved: bool, by: Principal, reason: str,
                          clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """The decision names the hash it covers; a decision for any other hash, or by a principal the
    request's owner does not name (a subject, ``role:<role>`` or ``group:<group>``,
    ``Principal.is_owner``) nor, once the request was escalated, its ``escalate_to``, is refused.
    ``by.subject`` is recorded as who decided. The owner is checked on the run as locked for the
    decision, so a run that starts waiting meanwhile waits for the decision to commit and is never
    decided by whom it was not checked against."""
    actor = by.subject
    stored = await _locked(tx, run_id)
    wait = stored.snapshot.wait
    if wait is not None and wait.approval_id == approval_id and not may_act(by, wait):
        raise NotPermitted(run_id, actor, _who_may_act(wait))
    return await _apply_to(
        tx, stored, "approve" if approved else "deny", actor=actor, reason=reason, clock=clock,
        details={"approval_id": approval_id, "approved_hash": approved_hash, "credential": by.credential},
        build=lambda seq, at: ev.ApprovalDecided(seq=seq, at=at, approval_id=approval_id, approved=approved,
                                                 approved_hash=approved_hash, decided_by=actor))


def may_act(by: Principal, wait: Wait) -> bool:
    """Whether ``by`` may decide or answer ``wait``: its owner names them, or its escalation, once due
    (``domain.reminders.deciders``)."""
    return any(by.is_owner(who) for who in reminders.deciders(wait))


def _who_may_act(wait: Wait) -> str:
    named = " or ".join(str(who) for who in reminders.deciders(wait))
    if wait.escalate_to is not None and not wait.escalated:
        return f"{named} ({wait.escalate_to} once it is escalated)"
    return named


async def answer(tx: RunTransaction, run_id: str, *, question_id: str, answer: object, by: Principal, reason: str,
                 clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """A person's answer to the question the run waits on: checked against the question's schema
    (``AnswerRefused`` names every violation, and nothing is written), recorded as
    ``question.resolved`` (the fact ``answer:<question_id>``, by ``actor``) and the run woken. Only
    a principal the question's owner names, if it names one (or, once escalated, its ``escalate_to``),
    may answer. The same answer again changes nothing and says so (``repeated``); any other answer to
    a question that is not open is refused, naming why."""
    actor = by.subject
    stored = await _locked(tx, run_id)
    run = stored.snapshot
    what = f"an answer to question {question_id!r}"
    given = run.fact(ANSWER_FACT_PREFIX + question_id)
    if given is not None:
        if given.value == freeze(answer):
            return {"run_id": run_id, "status": run.status.value, "revision": run.revision, "repeated": True}
        raise NotPending(run_id, what, f"{given.source.removeprefix('user:')} answered it already")
    wait = run.wait
    question = next((q for q in run.open_questions if q.question_id == question_id), None)
    if question is None or wait is None or wait.question_id != question_id:
        raise NotPending(run_id, what, _asked(run))
    if not may_act(by, wait):
        raise NotPermitted(run_id, actor, _who_may_act(wait), "answer this question")
    problems = questions.answer_problems(question.answer_schema, answer)
    if problems:
        raise AnswerRefused(run_id, question_id, problems)
    result = await _apply_to(
        tx, stored, "answer", actor=actor, reason=reason, clock=clock,
        details={"question_id": question_id, "credential": by.credential},
        build=lambda seq, at: ev.QuestionResolved(seq=seq, at=at, question_id=question_id, answer=freeze(answer),
                                                  answered_by=actor))
    return {**result, "repeated": False}


async def _action_of(tx: RunTransaction, run_id: str, logical_action: str, what: str) -> tuple[StoredRun, ActionRecord]:
    """The run, locked, and its action ``logical_action``; ``what`` names the operation refused."""
    stored = await tx.load(run_id, lock=True)
    if stored is None:
        raise RunNotFound(run_id)
    action = stored.snapshot.action(logical_action)
    if action is None:
        raise NotPending(run_id, what, f"the run has no action {logical_action!r}")
    return stored, action


async def resolve_action(tx: RunTransaction, run_id: str, *, logical_action: str, done: bool,
                         external_id: str | None, receipt: Mapping[str, Any] | None, actor: str, reason: str,
                         clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """A person settles an action whose outcome is in doubt (UNKNOWN, RECONCILING or NEEDS_ATTENTION)
    with what they found on the far side: ``done`` with its external id and receipt (CONFIRMED; the
    receipt becomes the fact ``receipt:<logical_action>`` as a worker's would, so ``decide`` reads
    it), or not done (RETRYABLE: the worker submits it again under the same idempotency key). An
    action nobody claimed yet is claimed by the resolution (``action.reconciliation_started``); a
    reconciler's claim in flight is superseded (its later answer is dropped). Once nothing else is in
    doubt the run moves on: out of ACTION_UNKNOWN by the domain, out of NEEDS_ATTENTION here."""
    if done and not external_id:
        raise ResolutionRefused(run_id, logical_action, "a confirmation needs the external id found on the far side")
    if not done and (external_id or receipt):
        raise ResolutionRefused(run_id, logical_action, "an action not done has no external id or receipt")
    what = f"resolving {logical_action!r}"
    stored, action = await _action_of(tx, run_id, logical_action, what)
    run = stored.snapshot
    if action.status not in UNRECONCILED:
        raise NotPending(run_id, what, f"the action is {action.status.value}, not in doubt")
    at = clock()
    outcome = ActionStatus.CONFIRMED if done else ActionStatus.RETRYABLE
    kept = dict(receipt or {}) | ({"external_id": external_id} if done else {})
    events: list[ev.RunEvent] = []
    if action.status is ActionStatus.UNKNOWN:
        events.append(ev.ReconciliationStarted(seq=stored.seq(1), at=at, logical_action=logical_action))
    events.append(ev.ActionResolved(seq=stored.seq(len(events) + 1), at=at, logical_action=logical_action,
                                    outcome=outcome, by=actor, reason=reason, external_id=external_id))
    if done:
        events.append(ev.FactRecorded(seq=stored.seq(len(events) + 1), at=at,
                                      key=f"{RECEIPT_FACT_PREFIX}{logical_action}", value=freeze(kept),
                                      source=f"operator:{actor}"))
    others = [a.logical_action for a in run.actions if a.status in UNRECONCILED and a.logical_action != logical_action]
    if run.status is RunStatus.NEEDS_ATTENTION and not others:
        events.append(ev.RunStatusChanged(seq=stored.seq(len(events) + 1), at=at, to=RunStatus.READY,
                                          reason=f"{logical_action} resolved by {actor}"))
    after = await tx.append(stored, events)
    await tx.record(LedgerOutcome(action.idempotency_key, outcome, {
        "external_id": external_id, "receipt": kept if done else None, "last_error": None}))
    await tx.audit(actor=actor, action="resolve", target=run_id, reason=reason, details={
        "logical_action": logical_action, "outcome": outcome.value, "external_id": external_id,
        "from": run.status.value, "to": after.snapshot.status.value})
    await _publish(tx, stored, after, actor=actor, action="resolve", kinds=None)
    return {"run_id": run_id, "status": after.snapshot.status.value, "revision": after.snapshot.revision,
            "action": {"logical_action": logical_action, "status": outcome.value}}


async def retry_action(tx: RunTransaction, run_id: str, *, logical_action: str, actor: str, reason: str,
                       clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """A person retries one action that FAILED (the far side rejected it, or its retries ran out) once
    they fixed the cause: it becomes RETRYABLE and the worker submits it again under the same
    idempotency key, so the far side dedups. Only while the run has not ended: a run that ended FAILED
    was announced as such and stays so. A run held in NEEDS_ATTENTION (its ``decide`` asked again for
    the failed action) moves on once nothing else is in doubt, as with ``resolve_action``."""
    what = f"retrying {logical_action!r}"
    stored, action = await _action_of(tx, run_id, logical_action, what)
    run = stored.snapshot
    if action.status is not ActionStatus.FAILED:
        raise NotPending(run_id, what, f"the action is {action.status.value}, not FAILED")
    if run.status in TERMINAL:
        raise NotPending(run_id, what, f"the run ended {run.status.value}")
    at = clock()
    events: list[ev.RunEvent] = [ev.ActionResolved(seq=stored.seq(1), at=at, logical_action=logical_action,
                                                   outcome=ActionStatus.RETRYABLE, by=actor, reason=reason)]
    others = [a for a in run.actions if a.status in UNRECONCILED]
    if run.status is RunStatus.NEEDS_ATTENTION and not others:
        events.append(ev.RunStatusChanged(seq=stored.seq(2), at=at, to=RunStatus.READY,
                                          reason=f"{logical_action} retried by {actor}"))
    after = await tx.append(stored, events)
    await tx.record(LedgerOutcome(action.idempotency_key, ActionStatus.RETRYABLE, {"last_error": None}))
    await tx.audit(actor=actor, action="retry-action", target=run_id, reason=reason, details={
        "logical_action": logical_action, "idempotency_key": action.idempotency_key, "failure": action.detail,
        "from": run.status.value, "to": after.snapshot.status.value})
    await _publish(tx, stored, after, actor=actor, action="retry-action", kinds=None)
    return {"run_id": run_id, "status": after.snapshot.status.value, "revision": after.snapshot.revision,
            "action": {"logical_action": logical_action, "status": ActionStatus.RETRYABLE.value}}


async def retry(tx: RunTransaction, run_id: str, *, actor: str, reason: str,
                clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """A person sends a run that needs attention back to work, e.g. once a kind whose ``decide`` raised
    is fixed and deployed: READY, its failed steps counted anew, a worker woken. Refused while one of
    its actions is in doubt (``resolve`` settles that)."""
    stored = await _locked(tx, run_id)
    refused = _retry_refusal(stored.snapshot)
    if refused is not None:
        raise NotPending(run_id, "retrying the run", refused)
    return await _apply_to(tx, stored, "retry", actor=actor, reason=reason, clock=clock, build=lambda seq, at:
                           ev.RunStatusChanged(seq=seq, at=at, to=RunStatus.READY, reason=f"retried by {actor}"))


def _retry_refusal(run: RunSnapshot) -> str | None:
    if run.status is not RunStatus.NEEDS_ATTENTION:
        return f"it is {run.status.value}, not NEEDS_ATTENTION"
    doubtful = [a.logical_action for a in run.actions if a.status in UNRECONCILED]
    return f"{', '.join(doubtful)} is in doubt: resolve it instead" if doubtful else None


ARTIFACT_FACT_PREFIX = "artifact:"
"""An attached artifact is the fact ``artifact:<name>``: its content hash, size and media type."""
ARTIFACT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


async def attach_artifact(tx: RunTransaction, run_id: str, *, name: str, content_hash: str, size: int,
                          media_type: str, actor: str, reason: str,
                          clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """A person attaches evidence (a log, a screenshot, an export) to a run: the bytes are uploaded and
    registered by the caller, in this transaction; the run records the fact ``artifact:<name>``, which
    its ``decide`` and ``accept`` can read, vouched for by ``operator:<actor>``. Attaching under a name
    again points the fact at the new content (history keeps both). A finished run keeps it as a late
    event: its history shows it, its state does not change."""
    if not ARTIFACT_NAME.fullmatch(name):
        raise AttachmentRefused(run_id, f"name must be 1-100 letters, digits, '.', '_' or '-', starting with a "
                                        f"letter or digit; got {name[:120]!r}")
    stored = await tx.load(run_id, lock=True)
    if stored is None:
        raise RunNotFound(run_id)
    value = {"content_hash": content_hash, "size": size, "media_type": media_type}
    after = await tx.append(stored, [ev.FactRecorded(seq=stored.seq(1), at=clock(), key=ARTIFACT_FACT_PREFIX + name,
                                                     value=freeze(value), source=f"operator:{actor}")])
    await tx.audit(actor=actor, action="attach", target=run_id, reason=reason, details={"name": name, **value})
    await _publish(tx, stored, after, actor=actor, action="attach", kinds=None)
    return {"run_id": run_id, "status": after.snapshot.status.value, "revision": after.snapshot.revision,
            "artifact": {"name": name, **value}}


def _asked(run: RunSnapshot) -> str:
    """What the run asks a person for now, for a refusal."""
    wait = run.wait
    if wait is not None and wait.question_id is not None:
        return f"it waits for the answer to question {wait.question_id!r}"
    if wait is not None and wait.approval_id is not None:
        return f"it waits for approval {wait.approval_id}, not an answer"
    return f"it is {run.status.value} and waits for no answer"


async def cancel(tx: RunTransaction, run_id: str, *, actor: str, reason: str,
                 clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """The run and its children whose policy is ``cancel`` (``family``) go CANCELLING."""
    return await family.with_children(tx, run_id, _cancel_one(tx, actor, clock), lambda: _apply(
        tx, run_id, "cancel", actor=actor, reason=reason, clock=clock,
        build=lambda seq, at: ev.CancelRequested(seq=seq, at=at, by=actor, reason=reason)))


def _cancel_one(tx: RunTransaction, actor: str, clock: Callable[[], float]) -> family.CancelOne:
    def one(stored: StoredRun, why: str) -> Awaitable[dict[str, Any]]:
        return _apply_to(tx, stored, "cancel", actor=actor, reason=why, clock=clock,
                         build=lambda seq, at: ev.CancelRequested(seq=seq, at=at, by=actor, reason=why))
    return one


async def pause(tx: RunTransaction, run_id: str, *, actor: str, reason: str,
                clock: Callable[[], float] = time.time) -> dict[str, Any]:
    return await _apply(tx, run_id, "pause", actor=actor, reason=reason, clock=clock,
                        build=lambda seq, at: ev.RunPaused(seq=seq, at=at, by=actor, reason=reason))


async def resume(tx: RunTransaction, run_id: str, *, actor: str, reason: str,
                 clock: Callable[[], float] = time.time) -> dict[str, Any]:
    return await _apply(tx, run_id, "resume", actor=actor, reason=reason, clock=clock,
                        build=lambda seq, at: ev.RunResumed(seq=seq, at=at, by=actor, reason=reason))


async def terminate(tx: RunTransaction, run_id: str, *, actor: str, reason: str,
                    clock: Callable[[], float] = time.time, kinds: Registry | None = None) -> dict[str, Any]:
    """Immediate and final; cleanup is skipped on purpose (the audit row says who and why). Its children
    whose policy is ``cancel`` are cancelled (``family``)."""
    return await family.with_children(tx, run_id, _cancel_one(tx, actor, clock), lambda: _apply(
        tx, run_id, "terminate", actor=actor, reason=reason, clock=clock, kinds=kinds,
        build=lambda seq, at: ev.RunTerminated(seq=seq, at=at, by=actor, reason=reason)))


async def migrate(tx: RunTransaction, run_id: str, *, to_version: str, actor: str, reason: str, kinds: Registry,
                  clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """Move a run to another workflow version of its kind, on purpose: refused unless that version is
    deployed and declares it can take over the run where it stands (``RunKind.migrates_from``). The
    history records the old and new pins and who moved it."""
    stored = await tx.load(run_id, lock=True)
    if stored is None:
        raise RunNotFound(run_id)
    run = stored.snapshot
    try:
        target = kinds.get(run.kind, to_version)
    except LookupError as e:
        raise NotMigratable(run_id, str(e)) from None
    if not target.takes_over(run):
        raise NotMigratable(run_id, f"{run.kind}@{to_version} does not declare it takes over runs of version "
                                    f"{run.versions.workflow} at stage {run.stage!r}")
    result = await _apply(tx, run_id, "migrate", actor=actor, reason=reason, clock=clock, kinds=kinds,
                          details={"from_versions": to_plain(run.versions), "to_versions": to_plain(target.versions)},
                          build=lambda seq, at: ev.VersionsMigrated(seq=seq, at=at, versions=target.versions,
                                                                    by=actor, reason=reason))
    await tx.repin(run_id, target.versions)
    return {**result, "versions": to_plain(target.versions)}
