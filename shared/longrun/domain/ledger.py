"""How action events change a run's action summary.

Responsibility: the handlers ``evolve`` dispatches action events to. The ledger row is
the full record; the snapshot keeps one ``ActionRecord`` per logical action so decisions
and resumes can see what was done, what is pending and what is in doubt.

Invariants:
- Every action move goes through ``check_action_transition``.
- New work (prepare, submit, compensate) starts only from a worker step (RUNNING; or
  CANCELLING for compensation): a cancel request or a pause stops new actions. Outcomes
  (confirmed, failed, unknown, reconciled, resolved) apply in any open status, because
  the far side reports whenever it reports.
- Preparing refuses an idempotency key already used for another request
  (``IdempotencyKeyReused``), a logical action already prepared, a budget with no room
  (``BudgetExhausted``) and an approval that does not cover exactly this request hash.
- No action is prepared or submitted while another awaits reconciliation: what to do
  next depends on whether that effect happened.
- When the last action awaiting reconciliation settles, a run in ACTION_UNKNOWN goes
  back to READY (or will resume to READY, if paused), because nothing else would wake it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from longrun.domain import events as ev
from longrun.domain.action import UNRECONCILED, ActionRecord, ActionStatus, check_action_transition
from longrun.domain.budget import ensure_room
from longrun.domain.lifecycle import Handler, apply_charge, move, put_fact, reject
from longrun.domain.run import TERMINAL, RunStatus
from longrun.domain.snapshot import APPROVAL_FACT_PREFIX, RECEIPT_FACT_PREFIX, Fact, RunSnapshot
from longrun.errors import IdempotencyKeyReused, IllegalTransition

_S = RunStatus
_A = ActionStatus


def _record(s: RunSnapshot, e: ev.ActionEvent) -> ActionRecord:
    record = s.action(e.logical_action)
    if record is None:
        reject(s, e, f"no action {e.logical_action!r} was prepared")
    return record


def _advance(s: RunSnapshot, e: ev.ActionEvent, to: ActionStatus, **changes: Any) -> RunSnapshot:
    record = _record(s, e)
    check_action_transition(record.status, to)
    updated = replace(record, status=to, **changes)
    moved = s.replace(actions=tuple(updated if a is record else a for a in s.actions))
    if any(a.status in UNRECONCILED for a in moved.actions):
        return moved
    if moved.status is _S.ACTION_UNKNOWN:
        return move(moved, _S.READY, e.at)
    if moved.paused_from is _S.ACTION_UNKNOWN:
        return moved.replace(paused_from=_S.READY)
    return moved


def _refuse_while_unreconciled(s: RunSnapshot, e: ev.ActionEvent) -> None:
    doubtful = [a.logical_action for a in s.actions if a.status in UNRECONCILED]
    if doubtful:
        reject(s, e, f"no new effect while {', '.join(doubtful)} awaits reconciliation")


def _action_prepared(s: RunSnapshot, e: ev.ActionRequest) -> RunSnapshot:
    if s.status is not _S.RUNNING:
        reject(s, e, f"actions start only while RUNNING; the run is {s.status.value}")
    ensure_room(s.budget, "tool_calls", "cost")
    _refuse_while_unreconciled(s, e)
    clash = next((a for a in s.actions if a.idempotency_key == e.idempotency_key), None)
    if clash is not None and (clash.request_hash, clash.logical_action) != (e.request_hash, e.logical_action):
        raise IdempotencyKeyReused(e.idempotency_key, clash.request_hash, e.request_hash)
    existing = s.action(e.logical_action)
    if existing is not None:
        raise IllegalTransition("action", existing.status.value, _A.PREPARED.value)
    if e.approval_id is not None:
        approval = s.fact(APPROVAL_FACT_PREFIX + e.approval_id)
        decision = approval.value if approval is not None else None
        if not (
            isinstance(decision, Mapping)
            and decision.get("approved") is True
            and decision.get("approved_hash") == e.request_hash
        ):
            reject(s, e, f"approval {e.approval_id!r} does not approve request hash {e.request_hash}")
    record = ActionRecord(
        logical_action=e.logical_action, tool=e.tool, tool_version=e.tool_version,
        effect_kind=e.effect_kind, status=_A.PREPARED, idempotency_key=e.idempotency_key,
        request_hash=e.request_hash, approval_id=e.approval_id,
    )  # fmt: skip
    return s.replace(actions=(*s.actions, record))


def _action_submitted(s: RunSnapshot, e: ev.ActionSubmitted | ev.ActionRecorded) -> RunSnapshot:
    if s.status is not _S.RUNNING:
        reject(s, e, f"submissions happen only while RUNNING; the run is {s.status.value}")
    _refuse_while_unreconciled(s, e)
    return _advance(s, e, _A.SUBMITTED, attempts=_record(s, e).attempts + 1)


def _action_recorded(s: RunSnapshot, e: ev.ActionRecorded) -> RunSnapshot:
    """The five moves of a call recorded with its answer, in the order its five events would make them."""
    charged = apply_charge(_action_submitted(_action_prepared(s, e), e), e.at, tool_calls=1)
    if charged.status in TERMINAL:
        return charged  # the charge ended the run: the answer would arrive late, stored and not applied
    confirmed = _advance(charged, e, _A.CONFIRMED, external_id=e.external_id, receipt_ref=e.receipt_ref)
    return put_fact(confirmed, Fact(f"{RECEIPT_FACT_PREFIX}{e.logical_action}", e.receipt, f"tool:{e.tool}", e.at))


def _compensation_started(s: RunSnapshot, e: ev.CompensationStarted) -> RunSnapshot:
    if s.status not in (_S.RUNNING, _S.CANCELLING):
        reject(s, e, f"compensation starts only while RUNNING or CANCELLING; the run is {s.status.value}")
    return _advance(s, e, _A.COMPENSATING)


HANDLERS: Mapping[type[ev.RunEvent], Handler] = {
    ev.ActionPrepared: _action_prepared,
    ev.ActionRecorded: _action_recorded,
    ev.ActionSubmitted: _action_submitted,
    ev.ActionConfirmed: lambda s, e: _advance(
        s, e, _A.CONFIRMED, external_id=e.external_id, receipt_ref=e.receipt_ref
    ),
    ev.ActionFailed: lambda s, e: _advance(s, e, _A.FAILED, detail=e.error),
    ev.ActionUnavailable: lambda s, e: _advance(s, e, _A.RETRYABLE, detail=e.cause),
    ev.ActionUnknown: lambda s, e: _advance(s, e, _A.UNKNOWN, detail=e.cause),
    ev.ReconciliationStarted: lambda s, e: _advance(s, e, _A.RECONCILING),
    ev.ActionReconciled: lambda s, e: _advance(
        s, e, e.outcome, external_id=e.external_id, receipt_ref=e.receipt_ref, detail=e.note or None
    ),
    ev.ActionResolved: lambda s, e: _advance(
        s, e, e.outcome, external_id=e.external_id, receipt_ref=e.receipt_ref,
        detail=f"resolved by {e.by}: {e.reason}",
    ),  # fmt: skip
    ev.CompensationStarted: _compensation_started,
    ev.ActionCompensated: lambda s, e: _advance(s, e, _A.COMPENSATED, compensation_ref=e.receipt_ref),
}
