"""Reminders, escalation and approval validity through the kit, under simulated time: a person's wait
reminds its owner and escalates on durable timers, each a ``run.notice`` broadcast; the escalation
lets its role decide, and only from then on; whatever ends the wait cancels what was still to come;
and a decision older than its validity when the run resumes is asked again."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from longrun_client import timeline

from longrun.app.gateway.operate import NotPermitted
from longrun.domain import APPROVAL_FACT_PREFIX, ApprovalExpired, RunStatus, event_to_dict
from longrun.testing.kit import Kit
from tests.kinds import ASKING, PUBLISHING

REMINDED = {"release": "v1", "owner": "alice", "remind_after": [60, 120], "escalate_after": 300,
            "escalate_to": "group:leads"}


def types(kit: Kit, run_id: str) -> list[str]:
    return [e.type for e in kit.world.store.history(run_id)]


def lines(kit: Kit, run_id: str) -> list[str]:
    """The run's timeline as ``longrunctl run timeline`` and the console show it."""
    return [timeline.describe(e.seq, e.type, event_to_dict(e), True, datetime.now(UTC)).split(maxsplit=2)[2]
            for e in kit.world.store.history(run_id)]


def said(kit: Kit, run_id: str) -> list[tuple[Any, ...]]:
    return [(n["wait_kind"], n["notice"], n["reminder"], n["escalated_to"]) for n in kit.notices(run_id)]


def test_an_approval_reminds_its_owner_then_escalates_and_the_role_decides_only_once_escalated() -> None:
    with Kit(PUBLISHING) as kit:
        run_id = kit.start(REMINDED)
        kit.settle(timers=False)
        assert kit.status(run_id) is RunStatus.WAITING_USER
        [asked] = kit.notices(run_id)
        assert (asked["notice"], asked["approval_id"], asked["owner"], asked["subject"]) == \
            ("requested", "publish", "alice", "Publish release v1")
        assert asked["approved_hash"] == kit.snapshot(run_id).wait.approved_hash  # type: ignore[union-attr]
        with pytest.raises(NotPermitted, match="only alice \\(group:leads once it is escalated\\) may decide"):
            kit.decide(run_id, by="group:leads")
        kit.advance(61)
        kit.advance(60)
        assert said(kit, run_id) == [("approval", "requested", None, None), ("approval", "reminder", 1, None),
                                     ("approval", "reminder", 2, None)]
        with pytest.raises(NotPermitted):
            kit.decide(run_id, by="group:leads")
        kit.advance(180)
        assert said(kit, run_id)[-1] == ("approval", "escalated", None, "group:leads")
        with pytest.raises(NotPermitted, match="only alice or group:leads may decide this approval, not bob"):
            kit.decide(run_id, by="bob")
        kit.decide(run_id, by="group:leads")
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED
        recorded = types(kit, run_id)
        assert recorded.count("run.wait_reminded") == 2 and recorded.count("run.wait_escalated") == 1
        wait_id = kit.notices(run_id)[0]["wait_id"]
        assert [line for line in lines(kit, run_id) if line.startswith(("REMINDER", "ESCALATED"))] == [
            f"REMINDER  #1 of wait {wait_id} sent to its owner", f"REMINDER  #2 of wait {wait_id} sent to its owner",
            f"ESCALATED wait {wait_id}: group:leads may now decide too"]
        assert kit.executions("release.publish") == 1 and kit.check() == []


def test_a_decision_cancels_the_reminders_and_escalation_still_to_come() -> None:
    with Kit(PUBLISHING) as kit:
        run_id = kit.start(REMINDED)
        kit.settle(timers=False)
        kit.advance(61)
        kit.decide(run_id)
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED
        kit.advance(1000)
        assert said(kit, run_id) == [("approval", "requested", None, None), ("approval", "reminder", 1, None)]
        open_timers = [t for t in kit.world.store.timers.values() if t.fired_at is None and t.cancelled_at is None]
        assert open_timers == [] and "run.wait_escalated" not in types(kit, run_id)


def test_a_reminder_due_after_the_deadline_is_not_scheduled() -> None:
    with Kit(PUBLISHING) as kit:
        run_id = kit.start(REMINDED | {"decide_within": 90})
        kit.settle()
        assert kit.status(run_id) is RunStatus.FAILED
        assert said(kit, run_id) == [("approval", "requested", None, None), ("approval", "reminder", 1, None)]


def test_a_decision_older_than_its_validity_when_the_run_resumes_is_asked_again() -> None:
    with Kit(PUBLISHING) as kit:
        window = kit.world.clock() + 600
        run_id = kit.start({"release": "v2", "owner": "alice", "valid_for": 300, "window_at": window})
        kit.settle(timers=False)
        kit.decide(run_id)  # approved at once; the run sleeps until its window opens, 600 s later
        kit.settle(timers=False)
        assert kit.status(run_id) is RunStatus.RETRY_SCHEDULED
        decided = kit.snapshot(run_id).fact(APPROVAL_FACT_PREFIX + "publish")
        assert decided is not None and decided.value["valid_until"] == pytest.approx(decided.recorded_at + 300)
        kit.advance(601)
        kit.settle(timers=False)
        # The window opened: the decision was 600 s old, so it expired and the approval is asked again
        assert kit.status(run_id) is RunStatus.WAITING_USER and kit.executions("release.publish") == 0
        assert kit.snapshot(run_id).fact(APPROVAL_FACT_PREFIX + "publish") is None
        [expired] = [e for e in kit.world.store.history(run_id) if e.type == "run.approval_expired"]
        assert isinstance(expired, ApprovalExpired)
        assert (expired.approval_id, expired.valid_until) == ("publish", pytest.approx(decided.recorded_at + 300))
        assert types(kit, run_id).count("run.approval_decided") == 1
        [shown] = [line for line in lines(kit, run_id) if line.startswith("EXPIRED")]
        assert shown.startswith("EXPIRED   approval publish: decided ") and shown.endswith("; asked again")
        assert [n["notice"] for n in kit.notices(run_id)] == ["requested", "requested"]
        kit.decide(run_id)  # fresh: the run publishes at once
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED and kit.executions("release.publish") == 1
        assert kit.check() == []


def test_a_valid_decision_is_used_as_it_is() -> None:
    with Kit(PUBLISHING) as kit:
        run_id = kit.start({"release": "v3", "owner": "alice", "valid_for": 300,
                            "window_at": kit.world.clock() + 200})
        kit.settle(timers=False)
        kit.decide(run_id)
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED
        assert "run.approval_expired" not in types(kit, run_id) and len(kit.notices(run_id)) == 1


def test_a_question_is_broadcast_reminded_and_escalated_and_the_role_answers_once_escalated() -> None:
    with Kit(ASKING) as kit:
        run_id = kit.start({"task": "retry storms", "owner": "alice", "remind_after": [30],
                            "escalate_after": 60, "escalate_to": "group:leads"})
        kit.settle(timers=False)
        [asked] = kit.notices(run_id)
        assert (asked["wait_kind"], asked["question_id"], asked["subject"], asked["owner"]) == \
            ("question", "module", "Which module is 'retry storms' about?", "alice")
        with pytest.raises(NotPermitted):
            kit.answer(run_id, {"module": "billing"}, by="group:leads")
        kit.advance(61)
        assert said(kit, run_id)[1:] == [("question", "reminder", 1, None),
                                         ("question", "escalated", None, "group:leads")]
        kit.answer(run_id, {"module": "billing"}, by="group:leads")
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED and kit.check() == []
