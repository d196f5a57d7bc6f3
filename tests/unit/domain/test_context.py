"""Resume context: built from structured state only; compaction keeps what must never be lost."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from longrun.domain import (
    SETTLED,
    ActionConfirmed,
    ActionPrepared,
    ActionSubmitted,
    ActionUnknown,
    ApprovalDecided,
    CancelRequested,
    EffectKind,
    FactRecorded,
    FrozenMap,
    QuestionOpened,
    QuestionResolved,
    ResumeContext,
    RunStatus,
    RunStatusChanged,
    Usage,
    Wait,
    WaitStarted,
    build_resume_context,
    compact,
)

from .support import History


def busy_run(facts: int, confirmed: int) -> History:
    """A run with old facts, confirmed receipts, an approval, an answered question, an open question
    and pending actions."""
    h = History(budget=Usage(10, 10, 10.0))
    h.apply(RunStatusChanged, to=RunStatus.RUNNING, reason="leased")
    wait = Wait(wait_id="w", kind="approval", deadline=1e9, approval_id="ap", owner="u", approved_hash="h-pr")
    h.apply(WaitStarted, status=RunStatus.WAITING_USER, wait=wait)
    h.apply(ApprovalDecided, approval_id="ap", approved=True, approved_hash="h-pr", decided_by="u")
    h.apply(RunStatusChanged, to=RunStatus.RUNNING, reason="leased")
    h.apply(QuestionOpened, question_id="scope", text="which packages?", answer_schema=FrozenMap({"type": "array"}))
    h.apply(WaitStarted, status=RunStatus.WAITING_USER,
            wait=Wait(wait_id="wq", kind="question", deadline=1e9, question_id="scope"))
    h.apply(QuestionResolved, question_id="scope", answer=("payment-sdk",), answered_by="u")
    h.apply(RunStatusChanged, to=RunStatus.RUNNING, reason="leased")
    for i in range(facts):
        h.apply(FactRecorded, key=f"fact-{i}", value=i, source="tool:ci")
    names = [f"done-{i}" for i in range(confirmed)] + ["pending", "in-doubt"]
    for name in names:
        h.apply(ActionPrepared, logical_action=name, tool="t", tool_version="1", effect_kind=EffectKind.READ,
                idempotency_key=f"k-{name}", request_hash=f"h-{name}")  # fmt: skip
    for name in names[:-2]:
        h.apply(ActionSubmitted, logical_action=name)
        h.apply(ActionConfirmed, logical_action=name, receipt_ref=f"artifact://{name}")
    h.apply(ActionSubmitted, logical_action="in-doubt")
    h.apply(ActionUnknown, logical_action="in-doubt", cause="timeout")
    h.apply(QuestionOpened, question_id="q", text="which module owns the retry?",
            answer_schema=FrozenMap({"type": "string"}))
    return h


def test_the_context_is_derived_from_the_snapshot() -> None:
    snapshot = busy_run(facts=2, confirmed=1).snapshot
    ctx = build_resume_context(snapshot)
    assert (ctx.goal, ctx.permissions, ctx.stage) == (snapshot.goal, snapshot.permissions, snapshot.stage)
    assert ctx.facts == snapshot.facts and ctx.actions == snapshot.actions
    assert ctx.open_questions == snapshot.open_questions
    assert ctx.remaining == Usage(10, 10, 10.0)
    assert ctx.allowed_next_steps == ("reconcile:in-doubt",)  # no model turn while an outcome is unknown


def test_allowed_steps_follow_budget_and_cancellation() -> None:
    h = History(budget=Usage(model_calls=0, tool_calls=3, cost=5.0))
    h.apply(RunStatusChanged, to=RunStatus.RUNNING, reason="leased")
    steps = build_resume_context(h.snapshot).allowed_next_steps
    assert "call_tool" in steps and "ask_model" not in steps and "complete" in steps
    h.apply(CancelRequested, by="u", reason="stop")
    assert build_resume_context(h.snapshot).allowed_next_steps == ()


def protected(ctx: ResumeContext) -> tuple[object, ...]:
    return (
        ctx.goal,
        ctx.permissions,
        tuple(a for a in ctx.actions if a.status not in SETTLED),
        ctx.open_questions,
        tuple(f for f in ctx.facts if f.key.startswith(("approval.", "answer:"))),
        ctx.remaining,
        ctx.allowed_next_steps,
    )


@settings(max_examples=30, deadline=None, database=None)
@given(facts=st.integers(0, 6), confirmed=st.integers(0, 4), max_items=st.integers(0, 12))
def test_compaction_never_drops_goal_permissions_pending_actions_or_what_people_said(
    facts: int, confirmed: int, max_items: int
) -> None:
    ctx = build_resume_context(busy_run(facts, confirmed).snapshot)
    small = compact(ctx, max_items)
    assert protected(small) == protected(ctx)
    droppable = facts + confirmed
    assert small.omitted == max(0, droppable - max_items)
    assert len(small.facts) + len(small.actions) == len(ctx.facts) + len(ctx.actions) - small.omitted
    assert compact(small, max_items) == small  # compaction is idempotent


def test_compaction_drops_the_oldest_facts_before_any_receipt() -> None:
    ctx = build_resume_context(busy_run(facts=3, confirmed=2).snapshot)
    small = compact(ctx, max_items=3)
    assert [f.key for f in small.facts] == ["approval.ap", "answer:scope", "fact-2"]
    assert [a.logical_action for a in small.actions] == ["done-0", "done-1", "pending", "in-doubt"]
    smaller = compact(small, max_items=1)
    assert [a.logical_action for a in smaller.actions] == ["done-1", "pending", "in-doubt"]
    assert smaller.omitted == 4
