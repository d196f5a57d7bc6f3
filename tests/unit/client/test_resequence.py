"""What a durable consumer hands on: each event once, a run's in chain order, held back within a window,
and a gap reported when the events before a held one do not come."""

from __future__ import annotations

from typing import Any

import pytest
from longrun_client import Envelope, make
from longrun_client.resequence import Deliver, Gap, Late, Repeat, Resequencer, Step

STATUSES = ["READY", "RUNNING", "WAITING_EVENT", "RUNNING", "COMPLETED"]


def _accepted(run_id: str, *, repeated: bool = False) -> Envelope:
    return make("run.accepted", {"run_id": run_id, "idempotency_key": "k", "workflow": "steps", "repeated": repeated,
                                 "versions": {"workflow": "1", "prompt": "1", "model_policy": "1",
                                              "tool_schemas": "1"}},
                producer="scheduler", tenant_id="acme", run_id=run_id)


def _changed(run_id: str, seq: int, was: str, status: str, **meta: Any) -> Envelope:
    return make("run.event", {"seq": seq, "event_type": "run.status_changed", "status": status,
                              "data": {"from": was}}, producer="worker", tenant_id="acme", run_id=run_id, **meta)


def _run(run_id: str = "r-1") -> list[Envelope]:
    """A run's status events: READY -> RUNNING -> WAITING_EVENT -> RUNNING -> COMPLETED, at seqs 2, 4, 7, 9."""
    return [_changed(run_id, seq, was, status)
            for seq, was, status in zip([2, 4, 7, 9], STATUSES[:-1], STATUSES[1:], strict=True)]


def _delivered(steps: list[Step]) -> list[int]:
    return [s.event.payload.seq for s in steps if isinstance(s, Deliver) and s.event.type == "run.event"]


def test_events_in_order_are_handed_on_at_once_and_each_once() -> None:
    resequencer = Resequencer(window=5)
    events = _run()
    steps = resequencer.offer(_accepted("r-1"), 0.0)
    assert [type(s) for s in steps] == [Deliver]
    for event in events:
        steps += resequencer.offer(event, 0.0)
    assert _delivered(steps) == [2, 4, 7, 9]
    # a redelivery (same event_id) of one handed on is a repeat, to acknowledge and skip
    assert resequencer.offer(events[1], 1.0) == [Repeat(events[1])]
    assert resequencer.next_deadline() is None


def test_events_that_arrive_out_of_order_are_held_back_and_handed_on_in_seq_order() -> None:
    # Given the run's events published 2, 7, 9, 4 (the publisher reordered 4)
    resequencer = Resequencer(window=5)
    first, second, third, fourth = _run()
    resequencer.offer(_accepted("r-1"), 0.0)
    assert _delivered(resequencer.offer(first, 0.0)) == [2]
    # Then 7 and 9 wait for 4, and a redelivery of a held one keeps waiting with it
    assert resequencer.offer(third, 0.1) == [] and resequencer.offer(fourth, 0.2) == []
    assert resequencer.offer(third, 0.3) == []
    assert resequencer.next_deadline() == pytest.approx(5.1)
    # When 4 arrives within the window, Then 4, 7, 9 follow in that order and no gap is reported
    steps = resequencer.offer(second, 1.0)
    assert _delivered(steps) == [4, 7, 9] and not [s for s in steps if isinstance(s, Gap)]
    assert resequencer.expire(100.0) == []


def test_the_first_event_held_back_when_it_arrives_before_the_runs_accepted() -> None:
    # A run's first status change leaves READY: before run.accepted it cannot be told from a later one
    resequencer = Resequencer(window=5)
    first, second, *_ = _run()
    assert _delivered(resequencer.offer(second, 0.0)) == [4]  # seen first: it starts the chain
    assert resequencer.offer(first, 0.1) == [Late(first)]
    # but after run.accepted, a run whose first change is missing holds its second back
    other_first, other_second, *_ = _run("r-2")
    resequencer.offer(_accepted("r-2"), 0.0)
    assert resequencer.offer(other_second, 0.0) == []
    assert _delivered(resequencer.offer(other_first, 0.5)) == [2, 4]


def test_a_predecessor_that_does_not_come_within_the_window_is_reported_as_a_gap_then_the_rest_follows() -> None:
    resequencer = Resequencer(window=5)
    first, second, third, fourth = _run()
    resequencer.offer(_accepted("r-1"), 0.0)
    resequencer.offer(first, 0.0)
    assert resequencer.offer(third, 1.0) == [] and resequencer.offer(fourth, 2.0) == []
    # Before the window has passed nothing is given up
    assert resequencer.expire(5.9) == []
    # When it has, Then the gap (after 2, before 7) is reported, then 7 and 9 are handed on
    steps = resequencer.expire(6.0)
    assert steps[0] == Gap("r-1", 2, 7) and _delivered(steps) == [7, 9]
    # and 4 arriving after that is late: acknowledged, not handed on out of order
    assert resequencer.offer(second, 7.0) == [Late(second)]


def test_an_event_the_broker_dropped_is_reported_at_its_place_without_waiting_for_the_window() -> None:
    resequencer = Resequencer(window=60)
    first, second, third, fourth = _run()
    resequencer.offer(_accepted("r-1"), 0.0)
    resequencer.offer(first, 0.0)
    assert resequencer.offer(third, 0.0) == [] and resequencer.offer(fourth, 0.0) == []
    # When the broker reports 4 dropped, Then its gap is reported with its id and 7, 9 follow at once
    steps = resequencer.lost(second, 1.0)
    assert steps[0] == Gap("r-1", 2, None, (second.event_id,)) and _delivered(steps) == [7, 9]
    # A dropped run.accepted is a gap too; a drop of what was handed on already is nothing
    accepted = _accepted("r-9")
    assert resequencer.lost(accepted, 2.0) == [Gap("r-9", 0, None, (accepted.event_id,))]
    assert resequencer.lost(first, 2.0) == []


def test_a_drop_reported_after_later_events_of_its_run_were_handed_on_is_still_reported() -> None:
    # The lost-letters queue is read beside the queue: its report can come after the run's later events
    resequencer = Resequencer(window=60)
    first, second, third, _ = _run()
    assert _delivered(resequencer.offer(third, 0.0)) == [7]  # accepted and 2, 4 dropped: 7 starts the chain
    assert resequencer.lost(first, 0.1) == [Gap("r-1", 0, 7, (first.event_id,))]
    assert resequencer.lost(second, 0.1) == [Gap("r-1", 0, 7, (second.event_id,))]


def test_a_dropped_event_reported_before_its_successors_arrive_lets_them_through() -> None:
    resequencer = Resequencer(window=60)
    first, second, third, _ = _run()
    resequencer.offer(_accepted("r-1"), 0.0)
    resequencer.offer(first, 0.0)
    assert resequencer.lost(second, 0.1)[0] == Gap("r-1", 2, None, (second.event_id,))
    assert _delivered(resequencer.offer(third, 0.2)) == [7]


def test_runs_are_resequenced_apart_and_corrections_follow_a_completed_run() -> None:
    resequencer = Resequencer(window=5)
    one, two = _run("r-1"), _run("r-2")
    correction = make("run.event", {"seq": 12, "event_type": "run.correction_needed", "status": "COMPLETED",
                                    "data": {"logical_action": "a", "reason": "r"}},
                      producer="reconciler", tenant_id="acme", run_id="r-1")
    steps: list[Step] = []
    for event in [one[0], two[0], two[2], one[1], one[2], one[3], correction, two[1], two[3]]:
        steps += resequencer.offer(event, 0.0)
    handed = [(s.event.run_id, s.event.payload.seq) for s in steps if isinstance(s, Deliver)]
    assert [seq for run, seq in handed if run == "r-1"] == [2, 4, 7, 9, 12]
    assert [seq for run, seq in handed if run == "r-2"] == [2, 4, 7, 9]


def test_memory_is_bounded() -> None:
    resequencer = Resequencer(window=5, remember=2)
    events = [_changed(f"r-{n}", 2, "READY", "RUNNING") for n in range(3)]
    for event in events:
        resequencer.offer(event, 0.0)
    # the oldest id is forgotten: its redelivery can no longer be told from a first delivery
    assert resequencer.offer(events[2], 0.0) == [Repeat(events[2])]
    assert isinstance(resequencer.offer(events[0], 0.0)[0], Deliver)
