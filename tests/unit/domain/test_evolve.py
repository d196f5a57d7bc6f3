"""evolve and fold: how events change a run, and which events are refused or only recorded."""

from __future__ import annotations

import pytest

from longrun.domain import (
    APPROVAL_FACT_PREFIX,
    ActionCompensated,
    ActionConfirmed,
    ActionPrepared,
    ActionReconciled,
    ActionResolved,
    ActionStatus,
    ActionSubmitted,
    ActionUnknown,
    ApprovalDecided,
    AskModel,
    BudgetCharged,
    CallTool,
    CancelRequested,
    Complete,
    CompensationStarted,
    DecisionContext,
    EffectKind,
    Fail,
    FactRecorded,
    FrozenMap,
    QuestionOpened,
    ReconciliationStarted,
    RunCompleted,
    RunCreated,
    RunPaused,
    RunResumed,
    RunStatus,
    RunStatusChanged,
    RunTerminated,
    RunWoken,
    ScheduleRetry,
    StageChanged,
    Usage,
    Wait,
    WaitForEvent,
    WaitForUser,
    WaitStarted,
    WakeReason,
    budget_needs,
    evolve,
    exhausted,
    fold,
    idempotency_key,
    is_late,
    request_hash,
    wait_for,
)
from longrun.errors import BudgetExhausted, EventRejected, IdempotencyKeyReused, IllegalTransition

from .support import History

S = RunStatus
A = ActionStatus
PR_ARGS = FrozenMap({"repo": "payments", "branch": "agent/payment-sdk-v5"})
PR_HASH = request_hash("create_pr", "1", args=PR_ARGS)


def ctx(h: History, wait_id: str = "w-1") -> DecisionContext:
    return DecisionContext(now=h.now, new_id=lambda: wait_id, rng=None)  # type: ignore[arg-type]


def running(**kwargs: object) -> History:
    h = History(**kwargs)  # type: ignore[arg-type]
    h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    return h


def prepare(h: History, name: str = "pr", *, approval_id: str | None = None, hash_: str = PR_HASH) -> None:
    h.apply(
        ActionPrepared, logical_action=name, tool="create_pr", tool_version="1",
        effect_kind=EffectKind.NON_IDEMPOTENT_WRITE, request_hash=hash_, approval_id=approval_id,
        idempotency_key=idempotency_key("run-1", name, attempt_scope=1),
    )  # fmt: skip


def wait(h: History, decision: WaitForEvent | WaitForUser | ScheduleRetry, wait_id: str = "w-1") -> Wait:
    status, w = wait_for(decision, ctx(h, wait_id))
    h.apply(WaitStarted, status=status, wait=w)
    return w


def approval_wait(h: History) -> Wait:
    return wait(h, WaitForUser(approval_id="ap-1", owner="user_42", deadline=h.now + 86_400,
                               approved_hash=PR_HASH, summary="create the PR"))  # fmt: skip


def test_the_seed_walkthrough_folds_back_into_the_same_snapshot() -> None:
    # Given the upgrade task of the seed: CI, a timeout on PR creation, reconciliation, approval, completion
    h = running()
    prepare(h, "ci:1", hash_="h-ci")
    h.apply(ActionSubmitted, logical_action="ci:1")
    h.apply(ActionConfirmed, logical_action="ci:1", external_id="98127")
    wait(h, WaitForEvent(kind="ci", correlation_key="ci/run/98127", deadline=h.now + 3600))
    h.apply(RunWoken, wait_id="w-1", reason=WakeReason.EVENT, correlation_key="ci/run/98127")
    h.apply(RunWoken, wait_id="w-1", reason=WakeReason.DEADLINE)  # the deadline timer raced the webhook: late
    h.apply(FactRecorded, key="ci.98127", value=FrozenMap({"conclusion": "success"}), source="webhook:forge")
    h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    approval_wait(h)
    h.apply(ApprovalDecided, approval_id="ap-1", approved=True, approved_hash=PR_HASH, decided_by="user_42")
    h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    prepare(h, "pr", approval_id="ap-1")
    h.apply(ActionSubmitted, logical_action="pr")
    h.apply(ActionUnknown, logical_action="pr", cause="client timeout")
    h.apply(RunStatusChanged, to=S.ACTION_UNKNOWN, reason="PR creation timed out")
    h.apply(ReconciliationStarted, logical_action="pr")
    h.apply(ActionReconciled, logical_action="pr", outcome=A.CONFIRMED, external_id="PR-7")
    assert h.snapshot.status is S.READY  # the last reconciliation hands the run back
    h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    h.apply(BudgetCharged, model_calls=3, tool_calls=3, cost=1.82)
    h.apply(RunCompleted, evidence=FrozenMap({"ci": "98127", "pr": "PR-7"}))
    h.apply(ActionConfirmed, logical_action="pr", external_id="PR-7")  # a late duplicate receipt
    # Then replaying the stored history rebuilds exactly the snapshot we hold
    final = h.snapshot
    assert final.status is S.COMPLETED and final.acceptance is not None
    assert fold(h.events) == final
    assert final.revision == len(h.events) - 2  # two late events were stored, not applied
    assert final.last_seq == h.events[-2].seq


def test_creation_starts_ready_and_only_once() -> None:
    h = History()
    assert (h.snapshot.status, h.snapshot.revision, h.snapshot.last_seq) == (S.READY, 1, 1)
    with pytest.raises(EventRejected, match="already exists"):
        fields = ("run_id", "tenant_id", "kind", "goal", "versions", "budget")
        h.apply(RunCreated, **{f: getattr(h.events[0], f) for f in fields})
    with pytest.raises(EventRejected, match="run.created"):
        evolve(None, StageChanged(seq=1, at=0.0, stage="plan"))
    with pytest.raises(ValueError, match="empty"):
        fold([])


def test_each_applied_event_bumps_revision_and_seqs_must_increase() -> None:
    h = running()
    before = h.snapshot
    h.apply(StageChanged, stage="plan")
    assert (h.snapshot.revision, h.snapshot.last_seq) == (before.revision + 1, 3)
    with pytest.raises(EventRejected, match="seq 3 is not after"):
        evolve(h.snapshot, StageChanged(seq=3, at=9.0, stage="again"))


@pytest.mark.parametrize(
    ("status", "wait_fields", "problem"),
    [
        (S.WAITING_EVENT, {"kind": "ci", "deadline": 50.0}, "no wake condition"),
        (S.WAITING_EVENT, {"kind": "ci", "deadline": None, "correlation_key": "k"}, "no deadline"),
        (S.WAITING_USER, {"kind": "ok", "deadline": 50.0, "approval_id": "a", "approved_hash": "h"}, "owner"),
        (S.RETRY_SCHEDULED, {"kind": "timer", "deadline": 50.0}, "no retry timer"),
        (S.WAITING_EVENT, {"kind": "ci", "deadline": 50.0, "wake_at": 60.0}, "after the deadline"),
        (S.WAITING_EVENT, {"kind": "ci", "deadline": 0.5, "correlation_key": "k"}, "already passed"),
    ],
)
def test_a_wait_without_its_wake_condition_deadline_or_approval_fields_is_refused(
    status: RunStatus, wait_fields: dict[str, object], problem: str
) -> None:
    h = running()
    with pytest.raises(EventRejected, match=problem):
        h.apply(WaitStarted, status=status, wait=Wait(wait_id="w", **wait_fields))  # type: ignore[arg-type]
    assert h.snapshot.status is S.RUNNING


def test_waits_are_entered_and_left_only_through_their_own_events() -> None:
    h = running()
    with pytest.raises(EventRejected, match="run.wait_started"):
        h.apply(RunStatusChanged, to=S.WAITING_EVENT, reason="model said so")
    wait(h, WaitForEvent(kind="ci", correlation_key="ci/1", deadline=h.now + 60))
    with pytest.raises(EventRejected, match="run.woken"):
        h.apply(RunStatusChanged, to=S.READY, reason="impatient")
    with pytest.raises(EventRejected, match="correlation key"):
        h.apply(RunWoken, wait_id="w-1", reason=WakeReason.EVENT, correlation_key="ci/2")
    with pytest.raises(EventRejected, match="no timer"):
        h.apply(RunWoken, wait_id="w-1", reason=WakeReason.TIMER)
    h.apply(RunWoken, wait_id="w-1", reason=WakeReason.DEADLINE)
    assert h.snapshot.status is S.READY and h.snapshot.wait is None
    assert h.snapshot.last_wake is not None and h.snapshot.last_wake.reason is WakeReason.DEADLINE


def test_a_retry_waits_on_its_timer() -> None:
    h = running()
    decided_at = h.now
    w = wait(h, ScheduleRetry(logical_action="pr", delay=30.0))
    assert h.snapshot.status is S.RETRY_SCHEDULED and w.wake_at == w.deadline == decided_at + 30.0
    h.apply(RunWoken, wait_id="w-1", reason=WakeReason.TIMER)
    assert h.snapshot.status is S.READY


def test_a_wake_for_a_wait_that_already_ended_is_late_and_changes_nothing() -> None:
    h = running()
    wait(h, WaitForEvent(kind="ci", correlation_key="ci/1", deadline=h.now + 60), wait_id="w-old")
    h.apply(RunWoken, wait_id="w-old", reason=WakeReason.EVENT, correlation_key="ci/1")
    h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    wait(h, WaitForEvent(kind="ci", correlation_key="ci/2", deadline=h.now + 60), wait_id="w-new")
    before = h.snapshot
    stale = h.event(RunWoken, wait_id="w-old", reason=WakeReason.DEADLINE)
    assert is_late(before, stale)
    assert evolve(before, stale) is before


def test_an_approval_is_bound_to_the_exact_request_hash() -> None:
    h = running()
    approval_wait(h)
    with pytest.raises(EventRejected, match="pending request"):
        h.apply(ApprovalDecided, approval_id="ap-1", approved=True, approved_hash="other", decided_by="user_42")
    h.apply(ApprovalDecided, approval_id="ap-1", approved=True, approved_hash=PR_HASH, decided_by="user_42")
    fact = h.snapshot.fact(APPROVAL_FACT_PREFIX + "ap-1")
    assert fact is not None and fact.source == "user:user_42"
    h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    # When the agent changed the request after approval, Then the approval no longer covers it
    with pytest.raises(EventRejected, match="does not approve"):
        prepare(h, "pr", approval_id="ap-1", hash_=request_hash("create_pr", "1", args={"branch": "other"}))
    prepare(h, "pr", approval_id="ap-1")


def test_a_denied_approval_authorises_nothing() -> None:
    h = running()
    approval_wait(h)
    h.apply(ApprovalDecided, approval_id="ap-1", approved=False, approved_hash=PR_HASH, decided_by="user_42")
    h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    with pytest.raises(EventRejected, match="does not approve"):
        prepare(h, "pr", approval_id="ap-1")


def test_cancel_stops_new_actions_lets_running_ones_finish_and_then_ends_cancelled() -> None:
    h = running()
    prepare(h, "deploy")
    h.apply(ActionSubmitted, logical_action="deploy")
    h.apply(CancelRequested, by="user_42", reason="no longer needed")
    assert h.snapshot.cancel_requested and h.snapshot.status is S.CANCELLING
    with pytest.raises(EventRejected, match="RUNNING"):
        prepare(h, "notify")
    with pytest.raises(IllegalTransition, match="CANCELLING -> CANCELLING"):
        h.apply(CancelRequested, by="user_42", reason="twice")
    with pytest.raises(IllegalTransition, match="CANCELLING -> PAUSED"):
        h.apply(RunPaused, by="ops", reason="hold")
    with pytest.raises(EventRejected, match="in doubt: deploy"):
        h.apply(RunStatusChanged, to=S.CANCELLED, reason="cancelled")
    h.apply(ActionConfirmed, logical_action="deploy", receipt_ref="artifact://r1")
    h.apply(CompensationStarted, logical_action="deploy")
    h.apply(ActionCompensated, logical_action="deploy", receipt_ref="artifact://undo")
    h.apply(RunStatusChanged, to=S.CANCELLED, reason="cancelled by user_42")
    assert h.snapshot.status is S.CANCELLED and h.snapshot.terminal_reason == "cancelled by user_42"


def test_pause_keeps_the_wait_and_resume_restores_it() -> None:
    h = running()
    w = approval_wait(h)
    h.apply(RunPaused, by="ops", reason="incident")
    assert (h.snapshot.status, h.snapshot.paused_from, h.snapshot.wait) == (S.PAUSED, S.WAITING_USER, w)
    with pytest.raises(IllegalTransition, match="PAUSED -> PAUSED"):
        h.apply(RunPaused, by="ops", reason="again")
    h.apply(RunResumed, by="ops", reason="incident over")
    assert (h.snapshot.status, h.snapshot.wait, h.snapshot.paused_from) == (S.WAITING_USER, w, None)
    with pytest.raises(EventRejected, match="not PAUSED"):
        h.apply(RunResumed, by="ops", reason="again")


def test_a_run_paused_mid_step_resumes_ready_and_a_wake_while_paused_is_kept() -> None:
    h = running()
    h.apply(RunPaused, by="ops", reason="hold")
    h.apply(RunResumed, by="ops", reason="go")
    assert h.snapshot.status is S.READY  # the fenced-out worker must not be assumed alive
    h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    wait(h, WaitForEvent(kind="ci", correlation_key="ci/1", deadline=h.now + 60))
    h.apply(RunPaused, by="ops", reason="hold")
    h.apply(RunWoken, wait_id="w-1", reason=WakeReason.EVENT, correlation_key="ci/1")
    assert (h.snapshot.status, h.snapshot.paused_from, h.snapshot.wait) == (S.PAUSED, S.READY, None)
    h.apply(RunResumed, by="ops", reason="go")
    assert h.snapshot.status is S.READY


def test_preparing_needs_budget_room_and_an_overrunning_charge_ends_the_run() -> None:
    h = running(budget=Usage(model_calls=5, tool_calls=1, cost=10.0))
    h.apply(BudgetCharged, tool_calls=1)
    assert h.snapshot.status is S.RUNNING  # exactly at the limit is still consistent
    with pytest.raises(BudgetExhausted, match="tool_calls"):
        prepare(h)
    with pytest.raises(EventRejected, match="non-negative"):
        h.apply(BudgetCharged, cost=-1.0)
    h.apply(RunPaused, by="ops", reason="hold")
    h.apply(BudgetCharged, cost=12.5)  # the receipt of a call already in flight lands after the pause
    assert h.snapshot.status is S.BUDGET_EXHAUSTED
    assert h.snapshot.terminal_reason == "budget cost exhausted: 12.5 of 10.0"


def test_only_new_work_needs_budget_room() -> None:
    # A run allowed one tool call and no model at all
    h = running(budget=Usage(model_calls=0, tool_calls=1, cost=1.0))
    pr = CallTool(tool="create_pr", args=PR_ARGS, logical_action="pr")
    assert budget_needs(AskModel(purpose="plan"), h.snapshot) == ("model_calls", "cost")
    assert budget_needs(pr, h.snapshot) == ("tool_calls", "cost")
    assert exhausted(h.snapshot.budget, budget_needs(pr, h.snapshot)) is None  # a used-up model budget is no bar
    # once its one call is submitted and charged, finishing needs nothing, nor does re-sending that same
    # submission after a crash; a new call needs room it no longer has
    prepare(h)
    h.apply(ActionSubmitted, logical_action="pr")
    h.apply(BudgetCharged, tool_calls=1)
    for decision in (Complete(evidence=FrozenMap({})), Fail(reason="gave up"), pr):
        assert exhausted(h.snapshot.budget, budget_needs(decision, h.snapshot)) is None, decision
    another = CallTool(tool="create_pr", args=PR_ARGS, logical_action="pr-2")
    assert exhausted(h.snapshot.budget, budget_needs(another, h.snapshot)) == "tool_calls"


def test_an_idempotency_key_is_never_reused_for_another_request() -> None:
    h = running()
    prepare(h, "pr")
    key = idempotency_key("run-1", "pr", attempt_scope=1)
    with pytest.raises(IdempotencyKeyReused):
        h.apply(ActionPrepared, logical_action="pr-2", tool="create_pr", tool_version="1",
                effect_kind=EffectKind.READ, idempotency_key=key, request_hash="other")  # fmt: skip
    with pytest.raises(IllegalTransition, match="PREPARED -> PREPARED"):
        prepare(h, "pr")


def test_an_unknown_outcome_holds_the_run_until_reconciliation_or_an_operator_settles_it() -> None:
    h = running()
    with pytest.raises(EventRejected, match="nothing would wake"):
        h.apply(RunStatusChanged, to=S.ACTION_UNKNOWN, reason="no unknown action")
    prepare(h)
    h.apply(ActionSubmitted, logical_action="pr")
    with pytest.raises(IllegalTransition, match="SUBMITTED -> RECONCILING"):
        h.apply(ReconciliationStarted, logical_action="pr")
    h.apply(ActionUnknown, logical_action="pr", cause="timeout")
    with pytest.raises(EventRejected, match="no new effect while pr awaits reconciliation"):
        prepare(h, "notify")
    h.apply(RunStatusChanged, to=S.ACTION_UNKNOWN, reason="timeout")
    h.apply(ReconciliationStarted, logical_action="pr")
    h.apply(ActionReconciled, logical_action="pr", outcome=A.NEEDS_ATTENTION, note="no query API")
    assert h.snapshot.status is S.ACTION_UNKNOWN
    h.apply(ActionResolved, logical_action="pr", outcome=A.RETRYABLE, by="ops", reason="checked: not created")
    assert h.snapshot.status is S.READY
    h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    h.apply(ActionSubmitted, logical_action="pr")
    assert h.snapshot.action("pr").attempts == 2  # type: ignore[union-attr]
    with pytest.raises(EventRejected, match="no action 'ghost'"):
        h.apply(ActionConfirmed, logical_action="ghost")


def test_completion_needs_passed_acceptance_and_no_action_in_doubt() -> None:
    h = running()
    with pytest.raises(EventRejected, match="unmet acceptance conditions: ci green"):
        h.apply(RunCompleted, evidence=FrozenMap({}), unmet=("ci green",))
    prepare(h)
    h.apply(ActionSubmitted, logical_action="pr")
    with pytest.raises(EventRejected, match="in doubt: pr"):
        h.apply(RunCompleted, evidence=FrozenMap({}))
    h.apply(ActionConfirmed, logical_action="pr")
    h.apply(RunCompleted, evidence=FrozenMap({"pr": "PR-7"}))
    assert h.snapshot.status is S.COMPLETED


def test_a_finished_run_records_late_reports_and_refuses_commands() -> None:
    h = running()
    prepare(h)
    h.apply(ActionSubmitted, logical_action="pr")
    h.apply(RunTerminated, by="ops", reason="runaway")
    done = h.snapshot
    assert done.terminal_reason == "terminated by ops: runaway"
    for late in (
        h.event(ActionUnknown, logical_action="pr", cause="timeout"),
        h.event(BudgetCharged, cost=1.0),
        h.event(FactRecorded, key="ci", value="red", source="webhook"),
        h.event(RunWoken, wait_id="w-1", reason=WakeReason.EVENT, correlation_key="ci/1"),
    ):
        assert is_late(done, late) and evolve(done, late) is done
    for command, target in (
        (h.event(RunStatusChanged, to=S.READY, reason="reopen"), "READY"),
        (h.event(RunResumed, by="ops", reason="go"), "run.resumed"),
        (h.event(CancelRequested, by="ops", reason="stop"), "CANCELLING"),
        (h.event(QuestionOpened, question_id="q", text="?", answer_schema=FrozenMap()), "question.opened"),
    ):
        with pytest.raises(IllegalTransition, match=f"TERMINATED -> {target}"):
            evolve(done, command)


def test_facts_are_replaced_by_key() -> None:
    h = running()
    h.apply(FactRecorded, key="ci", value="red", source="webhook")
    h.apply(FactRecorded, key="sha", value="abc", source="tool:git")
    h.apply(FactRecorded, key="ci", value="green", source="webhook")
    assert [(f.key, f.value) for f in h.snapshot.facts] == [("sha", "abc"), ("ci", "green")]
