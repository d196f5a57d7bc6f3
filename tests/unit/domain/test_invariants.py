"""violations(): each rule reports a broken snapshot in words, and a healthy run reports nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from longrun.domain import (
    Acceptance,
    ActionRecord,
    ActionStatus,
    Budget,
    EffectKind,
    Fact,
    FrozenMap,
    RunSnapshot,
    RunStatus,
    Usage,
    Wait,
    violations,
)

from .support import History

S = RunStatus
BASE = History().snapshot


def action(name: str, status: ActionStatus, key: str | None = None) -> ActionRecord:
    return ActionRecord(logical_action=name, tool="t", tool_version="1", effect_kind=EffectKind.READ,
                        status=status, idempotency_key=key or f"k-{name}", request_hash="h")  # fmt: skip


EVENT_WAIT = Wait(wait_id="w", kind="ci", deadline=10.0, correlation_key="ci/1")
NO_EVIDENCE = Acceptance(FrozenMap({}))
UNMET = Acceptance(FrozenMap({}), ("ci",))
OVERSPENT = Budget(Usage(1, 1, 1.0), Usage(2, 0, 0.0))
A = ActionStatus


def at(status: RunStatus, **changes: object) -> RunSnapshot:
    reason = {"terminal_reason": "done"} if status in (S.COMPLETED, S.FAILED) else {}
    return replace(BASE, status=status, **reason | changes)  # type: ignore[arg-type]


def waiting(status: RunStatus, **wait_changes: object) -> RunSnapshot:
    return at(status, wait=replace(EVENT_WAIT, **wait_changes))  # type: ignore[arg-type]


BROKEN: list[tuple[str, RunSnapshot, str]] = [
    ("counters", replace(BASE, revision=3, last_seq=2), "counters"),
    ("terminal without reason", at(S.FAILED, terminal_reason=None), "terminal reason"),
    ("open with reason", replace(BASE, terminal_reason="why"), "terminal reason"),
    ("completed unchecked", at(S.COMPLETED), "without a recorded acceptance"),
    ("completed unmet", at(S.COMPLETED, acceptance=UNMET), "unmet acceptance conditions: ci"),
    ("acceptance elsewhere", replace(BASE, acceptance=NO_EVIDENCE), "only for COMPLETED"),
    ("completed in doubt", at(S.COMPLETED, acceptance=NO_EVIDENCE, actions=(action("pr", A.UNKNOWN),)), "in doubt: pr"),
    ("event wait no wake", waiting(S.WAITING_EVENT, correlation_key=None), "no wake condition"),
    ("event wait no deadline", waiting(S.WAITING_EVENT, deadline=None), "no deadline"),
    ("user wait unnamed", waiting(S.WAITING_USER), "approval_id, owner, approved_hash"),
    ("retry without timer", waiting(S.RETRY_SCHEDULED), "no retry timer"),
    ("timer after deadline", waiting(S.WAITING_EVENT, wake_at=11.0), "after the deadline"),
    ("waiting without wait", at(S.WAITING_EVENT), "without a pending wait"),
    ("wait while ready", replace(BASE, wait=EVENT_WAIT), "not waiting"),
    ("paused without origin", at(S.PAUSED), "paused_from"),
    ("paused from cancelling", at(S.PAUSED, paused_from=S.CANCELLING, cancel_requested=True), "cannot be"),
    ("cancel ignored", replace(BASE, cancel_requested=True), "cancel was requested"),
    ("cancelling unrequested", at(S.CANCELLING), "without a recorded cancel request"),
    ("unknown with nothing to reconcile", at(S.ACTION_UNKNOWN), "nothing would wake"),
    ("over budget", replace(BASE, budget=OVERSPENT), "model_calls used 2 of 1"),
    ("negative limit", replace(BASE, budget=Budget(Usage(-1, 1, 1.0))), "non-negative"),
    ("key reused", replace(BASE, actions=(action("a", A.CONFIRMED, "k"), action("b", A.PREPARED, "k"))), "key 'k'"),
    ("fact twice", replace(BASE, facts=(Fact("ci", 1, "x", 0.0), Fact("ci", 2, "x", 0.0))), "fact key"),
]  # fmt: skip


def test_a_fresh_run_has_no_violations() -> None:
    assert violations(BASE) == ()


@pytest.mark.parametrize(("snapshot", "message"), [(s, m) for _, s, m in BROKEN], ids=[n for n, _, _ in BROKEN])
def test_each_broken_rule_is_reported(snapshot: RunSnapshot, message: str) -> None:
    assert any(message in v for v in violations(snapshot)), violations(snapshot)


def test_over_budget_is_fine_once_the_run_ended_budget_exhausted() -> None:
    ended = at(S.BUDGET_EXHAUSTED, terminal_reason="budget", budget=OVERSPENT)
    assert violations(ended) == ()
