"""Reminders, escalation and approval validity, as pure rules: which timers a person's wait needs,
what each records when it fires, who may decide before and after the escalation, and which decisions
expire where the run resumes."""

from __future__ import annotations

import random

import pytest

from longrun.domain import (
    APPROVAL_FACT_PREFIX,
    ActionPrepared,
    ApprovalDecided,
    ApprovalExpired,
    AskUser,
    DecisionContext,
    EffectKind,
    RunStatus,
    RunStatusChanged,
    WaitEscalated,
    WaitForUser,
    WaitReminded,
    WaitStarted,
    approval_validity,
    fold,
    reminders,
    wait_for,
)
from longrun.errors import EventRejected
from longrun.ports.runs import wait_timers

from .support import History

S = RunStatus
ASK = WaitForUser(approval_id="merge", owner="alice", deadline=1000.0, approved_hash="h1", summary="merge it",
                  remind_after=(60.0, 600.0, 2000.0), escalate_after=900.0, escalate_to="group:leads",
                  valid_for=300.0)


def _context(now: float = 0.0) -> DecisionContext:
    return DecisionContext(now=now, new_id=lambda: "w1", rng=random.Random(0))


def waiting(ask: WaitForUser = ASK) -> History:
    history = History()
    history.apply(RunStatusChanged, to=S.RUNNING, reason="taken")
    status, wait = wait_for(ask, _context(history.now))
    history.apply(WaitStarted, status=status, wait=wait)
    return history


def test_a_wait_schedules_its_reminders_and_escalation_but_none_past_its_deadline() -> None:
    run = waiting().snapshot
    assert run.wait is not None
    due = {t["timer_key"]: (t["kind"], t["delay"], t["payload"]) for t in wait_timers(run, decided_at=0.0)}
    assert due == {
        "run-1:w1:deadline": ("wait_deadline", 1000.0, {"wait_id": "w1", "reason": "deadline"}),
        "run-1:w1:reminder:1": ("wait_reminder", 60.0, {"wait_id": "w1", "reminder": 1}),
        "run-1:w1:reminder:2": ("wait_reminder", 600.0, {"wait_id": "w1", "reminder": 2}),
        "run-1:w1:escalation": ("wait_escalation", 900.0, {"wait_id": "w1"}),
    }
    # Asked 950 s before its deadline, the escalation at 900 s still comes; at 800 s before, it does not
    assert "run-1:w1:escalation" in {t["timer_key"] for t in reminders.timers("run-1", run.wait, decided_at=50.0)}
    assert "run-1:w1:escalation" not in {t["timer_key"] for t in reminders.timers("run-1", run.wait, decided_at=200.0)}


@pytest.mark.parametrize("bad", [
    {"remind_after": (0.0,)}, {"remind_after": (-5.0,)}, {"remind_after": "60"}, {"remind_after": (60.0, None)},
    {"escalate_after": 60.0}, {"escalate_to": "group:leads"}, {"escalate_after": 0.0, "escalate_to": "group:leads"},
    {"escalate_after": 60.0, "escalate_to": " "}, {"valid_for": 0.0}, {"valid_for": True},
])
def test_a_request_that_declares_nonsense_is_refused_naming_what(bad: dict[str, object]) -> None:
    fields = {"approval_id": "a", "owner": "alice", "deadline": 10.0, "approved_hash": "h", "summary": "s"}
    with pytest.raises(ValueError):
        WaitForUser(**fields | bad)  # type: ignore[arg-type]
    question = {k: v for k, v in bad.items() if k != "valid_for"}
    if question:
        with pytest.raises(ValueError):
            AskUser(question_id="q", text="?", answer_schema={}, deadline=10.0, **question)  # type: ignore[arg-type]


def test_reminders_given_as_a_list_are_held_as_a_tuple() -> None:
    ask = WaitForUser(approval_id="a", owner="alice", deadline=10.0, approved_hash="h", summary="s",
                      remind_after=[1.0, 2.0])  # type: ignore[arg-type]
    assert ask.remind_after == (1.0, 2.0) and hash(ask) == hash(ask)


def test_a_reminder_changes_nothing_and_an_escalation_admits_its_role_once() -> None:
    history = waiting()
    run = history.snapshot
    assert reminders.deciders(run.wait) == ("alice",)  # type: ignore[arg-type]
    reminded = reminders.on_timer(run, "wait_reminder", {"wait_id": "w1", "reminder": 1}, seq=4, at=61.0)
    assert reminded == WaitReminded(seq=4, at=61.0, wait_id="w1", reminder=1)
    after = history.apply(WaitReminded, wait_id="w1", reminder=1)
    assert (after.wait, after.status) == (run.wait, S.WAITING_USER)
    escalated = reminders.on_timer(after, "wait_escalation", {"wait_id": "w1"}, seq=5, at=901.0)
    assert escalated == WaitEscalated(seq=5, at=901.0, wait_id="w1", to="group:leads")
    now = history.apply(WaitEscalated, wait_id="w1", to="group:leads")
    assert now.wait is not None and now.wait.escalated and reminders.deciders(now.wait) == ("alice", "group:leads")
    assert reminders.on_timer(now, "wait_escalation", {"wait_id": "w1"}, seq=6, at=902.0) is None
    with pytest.raises(EventRejected, match="escalated already"):
        history.apply(WaitEscalated, wait_id="w1", to="group:leads")
    with pytest.raises(EventRejected, match="declares 3 reminders"):
        history.apply(WaitReminded, wait_id="w1", reminder=4)
    assert fold(history.events) == history.snapshot


def test_a_timer_of_a_wait_that_ended_records_nothing() -> None:
    history = waiting()
    history.apply(ApprovalDecided, approval_id="merge", approved=True, approved_hash="h1", decided_by="alice")
    run = history.snapshot
    assert reminders.on_timer(run, "wait_reminder", {"wait_id": "w1", "reminder": 1}, seq=9, at=61.0) is None
    assert reminders.on_timer(run, "wait_escalation", {"wait_id": "w1"}, seq=9, at=901.0) is None
    with pytest.raises(EventRejected, match="not pending"):
        history.apply(WaitReminded, wait_id="w1", reminder=1)


def test_a_decision_records_when_it_expires_and_expires_only_once_past_it_and_unused() -> None:
    history = waiting()
    decided = history.apply(ApprovalDecided, approval_id="merge", approved=True, approved_hash="h1",
                            decided_by="alice")
    fact = decided.fact(APPROVAL_FACT_PREFIX + "merge")
    assert fact is not None and fact.value["valid_until"] == fact.recorded_at + 300
    history.apply(RunStatusChanged, to=S.RUNNING, reason="taken")
    run = history.snapshot
    assert approval_validity.expired(run, now=fact.recorded_at + 299, seq=9, at=0.0) == []
    [expired] = approval_validity.expired(run, now=fact.recorded_at + 300, seq=9, at=1.0)
    assert expired == ApprovalExpired(seq=9, at=1.0, approval_id="merge", decided_at=fact.recorded_at,
                                      valid_until=fact.recorded_at + 300)
    after = history.apply(ApprovalExpired, approval_id="merge", decided_at=fact.recorded_at,
                          valid_until=fact.recorded_at + 300)
    assert after.fact(APPROVAL_FACT_PREFIX + "merge") is None and fold(history.events) == after
    # The decision stays in the history; asking again is a new wait for the same approval
    assert [e.type for e in history.events].count("run.approval_decided") == 1
    status, wait = wait_for(ASK, DecisionContext(now=history.now, new_id=lambda: "w2", rng=random.Random(0)))
    assert history.apply(WaitStarted, status=status, wait=wait).wait == wait


def test_a_decision_a_call_was_prepared_under_never_expires() -> None:
    history = waiting()
    history.apply(ApprovalDecided, approval_id="merge", approved=True, approved_hash="h1", decided_by="alice")
    history.apply(RunStatusChanged, to=S.RUNNING, reason="taken")
    history.apply(ActionPrepared, logical_action="merge", tool="forge.merge", tool_version="1",
                  effect_kind=EffectKind.NON_IDEMPOTENT_WRITE, idempotency_key="k1", request_hash="h1",
                  approval_id="merge")
    assert approval_validity.expired(history.snapshot, now=10_000.0, seq=9, at=0.0) == []
    with pytest.raises(EventRejected, match="cannot expire"):
        history.apply(ApprovalExpired, approval_id="merge", decided_at=0.0, valid_until=1.0)


def test_a_decision_without_a_validity_never_expires() -> None:
    history = waiting(WaitForUser(approval_id="merge", owner="alice", deadline=1000.0, approved_hash="h1",
                                  summary="merge it"))
    history.apply(ApprovalDecided, approval_id="merge", approved=False, approved_hash="h1", decided_by="alice")
    history.apply(RunStatusChanged, to=S.RUNNING, reason="taken")
    fact = history.snapshot.fact(APPROVAL_FACT_PREFIX + "merge")
    assert fact is not None and "valid_until" not in fact.value
    assert approval_validity.expired(history.snapshot, now=1e12, seq=9, at=0.0) == []
