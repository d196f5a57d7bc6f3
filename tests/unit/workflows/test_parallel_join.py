"""A run kind that fans out writes and joins them (``CallTools``), through the kit, in memory: every call is
its own ledger entry and is recorded, the losers of a first-or-N join too, while the run goes on from the
join; a rejected call is an outcome; a call in doubt holds the run back only while the join needs it; and a
worker killed at any point of the fan-out, its losers still running or not, leaves exactly one effect per
call."""

from __future__ import annotations

from typing import Any

import pytest

from longrun.domain import ActionStatus, RunStatus, event_to_dict, joins
from longrun.testing.kit import CrashOutcome, Kit, every_crash
from tests.integration.join_kinds import FANNED, JOIN, NEXT, PUT, READ, SEND


def timeline(kit: Kit, run_id: str) -> list[tuple[str, Any]]:
    """(type, logical action or target status) of each event."""
    out = []
    for e in kit.world.store.history(run_id):
        data = event_to_dict(e)
        out.append((str(data["type"]), data.get("logical_action", data.get("to", data.get("status")))))
    return out


def statuses(kit: Kit, run_id: str) -> dict[str, ActionStatus]:
    return {a.logical_action: a.status for a in kit.snapshot(run_id).actions}


@pytest.mark.parametrize(("join", "satisfied_by"), [("all", 4), ("first", 1), (2, 2)])
def test_every_call_is_made_once_and_recorded_and_the_join_names_the_calls_that_satisfied_it(
        join: object, satisfied_by: int) -> None:
    with Kit(FANNED) as kit:
        run_id = kit.start({"calls": 4, "join": join})
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED
        assert statuses(kit, run_id) == {f"put:{i}": ActionStatus.CONFIRMED for i in range(4)}
        joined = joins.joined(kit.snapshot(run_id), JOIN)
        assert joined is not None and len(joined.by) == satisfied_by and joined.calls == tuple(statuses(kit, run_id))
        # one effect per call, each under its own key, and one join, recorded after the calls that satisfied it
        assert len(kit.far_side.objects) == 4 and kit.executions(PUT) == 4
        events = timeline(kit, run_id)
        assert [t for t, _ in events].count("run.joined") == 1
        at = events.index(("run.joined", None))
        assert {a for t, a in events[:at] if t == "action.confirmed"} >= set(joined.by)
        assert kit.check() == []


def test_reads_in_a_fan_out_are_on_record_before_they_are_sent_like_writes() -> None:
    with Kit(FANNED) as kit:
        run_id = kit.start({"calls": 2, "tool": READ})
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED
        events = timeline(kit, run_id)
        assert events.index(("action.submitted", "put:1")) < events.index(("action.confirmed", "put:0"))
        assert ("action.recorded", "put:0") not in events and kit.executions(READ) == 2
        assert kit.check() == []


def slow_losers(tool: str, args: Any) -> int:
    """put:0 answers at once, the others many event-loop turns later."""
    return 0 if args["item"] == 0 else 200


def test_the_losers_of_a_first_join_are_recorded_before_the_run_completes() -> None:
    with Kit(FANNED) as kit:
        run_id = kit.start({"calls": 3, "join": "first"})
        kit.settle()
        events = timeline(kit, run_id)
        joined = joins.joined(kit.snapshot(run_id), JOIN)
        assert joined is not None and len(joined.lost) == 2
        completed = events.index(("run.completed", None))
        assert all(events.index(("action.confirmed", loser)) < completed for loser in joined.lost)
        assert kit.snapshot(run_id).budget.used.tool_calls == 3


def test_a_first_join_goes_on_from_its_winner_while_its_slow_losers_still_run() -> None:
    with Kit(FANNED) as kit:
        kit.far_side.slow = slow_losers
        run_id = kit.start({"calls": 3, "join": "first", "then_call": True})
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED
        events = timeline(kit, run_id)
        joined = joins.joined(kit.snapshot(run_id), JOIN)
        assert joined is not None and joined.by == ("put:0",) and joined.lost == ("put:1", "put:2")
        # decide went on from the join, and its next call was made and answered, before the losers answered
        at = events.index(("run.joined", None))
        assert at < events.index(("action.submitted", NEXT)) < events.index(("action.confirmed", NEXT))
        losers = [events.index(("action.confirmed", loser)) for loser in joined.lost]
        assert events.index(("action.confirmed", NEXT)) < min(losers)
        # and they were recorded, each once, before the run completed
        assert max(losers) < events.index(("run.completed", None))
        assert statuses(kit, run_id) == dict.fromkeys(("put:0", "put:1", "put:2", NEXT), ActionStatus.CONFIRMED)
        assert kit.executions(PUT) == 4 and [t for t, _ in events].count("run.joined") == 1
        assert kit.check() == []


def test_a_fan_out_the_budget_cannot_pay_for_in_full_makes_no_call() -> None:
    with Kit(FANNED) as kit:
        run_id = kit.start({"calls": 3}, tool_calls=2)
        kit.settle()
        assert kit.status(run_id) is RunStatus.BUDGET_EXHAUSTED
        assert kit.snapshot(run_id).terminal_reason == "budget tool_calls exhausted: join writes needs 3, 2 left"
        assert kit.snapshot(run_id).actions == () and kit.executions(PUT) == 0
        assert kit.check() == []


def test_a_rejected_call_is_an_outcome_of_the_join_and_the_others_still_go_through() -> None:
    with Kit(FANNED) as kit:
        kit.far_side.arm("rejected")
        run_id = kit.start({"calls": 3})
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED
        assert sorted(s.value for s in statuses(kit, run_id).values()) == ["CONFIRMED", "CONFIRMED", "FAILED"]
        assert len(kit.far_side.objects) == 2
        assert kit.check() == []


def test_an_unavailable_call_of_an_unsatisfied_join_waits_for_its_retry_and_only_it_is_made_again() -> None:
    with Kit(FANNED) as kit:
        kit.far_side.arm("unavailable")
        run_id = kit.start({"calls": 3})
        kit.settle(timers=False)
        assert kit.status(run_id) is RunStatus.RETRY_SCHEDULED
        retried = [a for a, s in statuses(kit, run_id).items() if s is ActionStatus.RETRYABLE]
        assert len(retried) == 1 and joins.joined(kit.snapshot(run_id), JOIN) is None
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED
        assert set(statuses(kit, run_id).values()) == {ActionStatus.CONFIRMED}
        assert kit.executions(PUT) == 3 and kit.snapshot(run_id).action(retried[0]).attempts == 2  # type: ignore[union-attr]
        assert kit.check() == []


def test_a_loser_in_doubt_does_not_hold_back_a_satisfied_first_join() -> None:
    with Kit(FANNED) as kit:
        # the first request acts and never answers: that write is in doubt
        kit.far_side.arm("timeout_after_acting")
        run_id = kit.start({"calls": 2, "join": "first", "tool": SEND, "then_wait": True})
        kit.settle(timers=False)
        # the other call satisfied the join, and the run went on to its next step (a wait), not ACTION_UNKNOWN
        assert kit.status(run_id) is RunStatus.WAITING_EVENT
        joined = joins.joined(kit.snapshot(run_id), JOIN)
        assert joined is not None and len(joined.by) == 1 and len(joined.lost) == 1
        (loser,) = joined.lost
        assert ("action.unknown", loser) in timeline(kit, run_id)
        assert ("run.status_changed", RunStatus.ACTION_UNKNOWN.value) not in timeline(kit, run_id)
        # while it waited, the reconciler found the loser's effect
        assert statuses(kit, run_id)[loser] is ActionStatus.CONFIRMED
        kit.signal(run_id, "go", {})
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED
        assert kit.executions(SEND) == 2 and kit.check() == []


def test_an_all_join_with_a_call_in_doubt_parks_once_the_other_outcomes_are_recorded() -> None:
    with Kit(FANNED) as kit:
        kit.far_side.arm("timeout_after_acting")
        run_id = kit.start({"calls": 3, "tool": SEND})
        kit.settle(timers=False)
        events = timeline(kit, run_id)
        parked = events.index(("run.status_changed", RunStatus.ACTION_UNKNOWN.value))
        doubtful = next(a for t, a in events if t == "action.unknown")
        others = [a for t, a in events[:parked] if t == "action.confirmed"]
        assert len(others) == 2 and doubtful not in others
        assert ("run.joined", None) not in events[:parked]
        # the reconciler settled it, and the run joined and completed
        assert kit.status(run_id) is RunStatus.COMPLETED
        assert set(statuses(kit, run_id).values()) == {ActionStatus.CONFIRMED}
        assert kit.executions(SEND) == 3 and kit.check() == []


def completed_with_one_object_per_confirmed_call(outcome: CrashOutcome) -> tuple[Kit, str, str, set[str]]:
    """The run completed and the far side holds one object per key for every call confirmed (a
    non-idempotent write is never sent twice: ``kit.check``)."""
    kit = outcome.kit
    (run_id,) = kit.run_ids()
    where = f"{outcome.point} #{outcome.nth}"
    assert kit.status(run_id) is RunStatus.COMPLETED, where
    made = {a.idempotency_key for a in kit.snapshot(run_id).actions if a.status is ActionStatus.CONFIRMED}
    assert set(kit.far_side.objects) == made, where
    return kit, run_id, where, made


@pytest.mark.parametrize(("tool", "join"), [(PUT, "all"), (SEND, "all"), (SEND, "first")])
def test_a_worker_killed_anywhere_in_a_fan_out_leaves_one_effect_per_call(tool: str, join: str) -> None:
    def scenario(kit: Kit) -> None:
        kit.start({"calls": 3, "tool": tool, "join": join})
        kit.settle()

    outcomes = every_crash(FANNED, scenario)
    points = {o.point for o in outcomes}
    assert {"worker.before_tool_request", "worker.after_tool_response_before_record"} <= points
    for outcome in outcomes:
        # A first join's loser cut off before it was sent may be proven not done instead (RETRYABLE: the
        # reconciler found nothing under its key), and is not made once the join is satisfied.
        kit, run_id, where, made = completed_with_one_object_per_confirmed_call(outcome)
        expected = {ActionStatus.CONFIRMED} if join == "all" else {ActionStatus.CONFIRMED, ActionStatus.RETRYABLE}
        assert set(statuses(kit, run_id).values()) <= expected and len(made) >= (3 if join == "all" else 1), where
        assert kit.snapshot(run_id).fact(f"{joins.JOINED_FACT_PREFIX}{JOIN}") is not None, where
        assert kit.check() == [], where


@pytest.mark.parametrize("tool", [PUT, SEND])
def test_a_worker_killed_while_the_losers_of_a_first_join_run_leaves_them_settled_once(tool: str) -> None:
    def scenario(kit: Kit) -> None:
        kit.far_side.slow = slow_losers
        kit.start({"calls": 3, "tool": tool, "join": "first", "then_call": True})
        kit.settle()

    outcomes = every_crash(FANNED, scenario)
    taken_over = 0
    for outcome in outcomes:
        kit, run_id, where, _ = completed_with_one_object_per_confirmed_call(outcome)
        run = kit.snapshot(run_id)
        # no loser left submitted: sent again under its key, or in doubt and settled by the reconciler
        # (RETRYABLE: proven not done), and the join written once
        assert set(statuses(kit, run_id).values()) <= {ActionStatus.CONFIRMED, ActionStatus.RETRYABLE}, where
        assert statuses(kit, run_id)[NEXT] is ActionStatus.CONFIRMED, where
        assert [t for t, _ in timeline(kit, run_id)].count("run.joined") == 1, where
        assert kit.check() == [], where
        # a loser the dead worker left submitted after the join: the next one sent it again under a newer
        # token (an idempotent write), or recorded it in doubt for the reconciler (a non-idempotent one)
        events, lost = timeline(kit, run_id), joins.joined(run, JOIN).lost  # type: ignore[union-attr]
        after_join = events[events.index(("run.joined", None)):]
        taken_over += any(kit.far_side.highest_token[run.action(c).idempotency_key] > 1  # type: ignore[union-attr]
                          if tool == PUT else ("action.unknown", c) in after_join for c in lost)
    assert taken_over > 0
