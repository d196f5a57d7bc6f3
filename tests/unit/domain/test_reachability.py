"""Every legal run transition can actually be taken through ``evolve``: the table has no dead rows.

For each (from, to) pair in RUN_TRANSITIONS, build a short history that reaches ``from``
(for PAUSED: paused from the status it will resume to), then apply the one event a
runtime would use to reach ``to``, and check the snapshot lands there.
"""

from __future__ import annotations

import pytest

from longrun.domain import (
    RUN_TRANSITIONS,
    ActionPrepared,
    ActionReconciled,
    ActionStatus,
    ActionSubmitted,
    ActionUnknown,
    BudgetCharged,
    CancelRequested,
    DeadlinePassed,
    EffectKind,
    FrozenMap,
    ReconciliationStarted,
    RunCompleted,
    RunPaused,
    RunResumed,
    RunStatus,
    RunStatusChanged,
    RunTerminated,
    RunWoken,
    Usage,
    Wait,
    WaitStarted,
    WakeReason,
)

from .support import History

S = RunStatus
WAITS = {
    S.WAITING_EVENT: Wait(wait_id="w", kind="ci", deadline=1e9, correlation_key="ci/1"),
    S.WAITING_USER: Wait(wait_id="w", kind="ok", deadline=1e9, approval_id="ap", owner="u", approved_hash="h"),
    S.RETRY_SCHEDULED: Wait(wait_id="w", kind="timer", deadline=1e9, wake_at=1e9),
}
PAIRS = sorted((a, b) for a, targets in RUN_TRANSITIONS.items() for b in targets)
IMPOSED = {S.CANCELLING, S.TERMINATED, S.TIMED_OUT, S.BUDGET_EXHAUSTED}


def with_unknown_action(h: History) -> None:
    h.apply(ActionPrepared, logical_action="pr", tool="t", tool_version="1",
            effect_kind=EffectKind.NON_IDEMPOTENT_WRITE, idempotency_key="k", request_hash="h")  # fmt: skip
    h.apply(ActionSubmitted, logical_action="pr")
    h.apply(ActionUnknown, logical_action="pr", cause="timeout")


def reach(status: RunStatus, *, paused_from: RunStatus, deadline: bool = False) -> History:
    """``deadline``: a CANCELLING run cancels for its business deadline (it ends TIMED_OUT)."""
    h = History(budget=Usage(10, 10, 10.0))
    if status is S.PAUSED:
        h = reach(paused_from, paused_from=S.READY)
        h.apply(RunPaused, by="ops", reason="hold")
    elif status is S.CANCELLING and deadline:
        h.apply(DeadlinePassed, reason="business_deadline: passed")
    elif status is S.CANCELLING:
        h.apply(CancelRequested, by="u", reason="stop")
    elif status is not S.READY:
        h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
        if status is not S.RUNNING:
            take(h, status)
    return h


def take(h: History, to: RunStatus) -> None:  # noqa: C901, PLR0912 - one branch per way in
    at = h.snapshot.status
    if at is S.PAUSED and to not in IMPOSED:
        h.apply(RunResumed, by="ops", reason="go")  # resumes to what it paused
    elif to is S.PAUSED:
        h.apply(RunPaused, by="ops", reason="hold")
    elif to is S.CANCELLING:
        h.apply(CancelRequested, by="u", reason="stop")
    elif to is S.TERMINATED:
        h.apply(RunTerminated, by="ops", reason="incident")
    elif to is S.BUDGET_EXHAUSTED:
        h.apply(BudgetCharged, cost=11.0)
    elif to is S.COMPLETED:
        h.apply(RunCompleted, evidence=FrozenMap({"ok": True}))
    elif to in WAITS:
        h.apply(WaitStarted, status=to, wait=WAITS[to])
    elif to is S.READY and at in WAITS:
        h.apply(RunWoken, wait_id="w", reason=WakeReason.DEADLINE)
    elif to is S.READY and at is S.ACTION_UNKNOWN:
        h.apply(ReconciliationStarted, logical_action="pr")
        h.apply(ActionReconciled, logical_action="pr", outcome=ActionStatus.CONFIRMED)
    else:
        if to is S.ACTION_UNKNOWN:
            with_unknown_action(h)
        h.apply(RunStatusChanged, to=to, reason="step")


@pytest.mark.parametrize(("from_", "to"), PAIRS, ids=[f"{a.value}->{b.value}" for a, b in PAIRS])
def test_every_legal_run_transition_is_reachable_through_evolve(from_: RunStatus, to: RunStatus) -> None:
    # Given a run in from_ (a paused run was paused from where it will resume to)
    h = reach(from_, paused_from=S.READY if to in IMPOSED else to, deadline=to is S.TIMED_OUT)
    assert h.snapshot.status is from_
    # When the runtime takes its usual way into to
    take(h, to)
    # Then the run is there
    assert h.snapshot.status is to
