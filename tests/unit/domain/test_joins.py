"""Joins in the pure domain: which of a fan-out's calls are still to make and which have an outcome,
when ALL, FIRST and at-least-N joins are satisfied and by which calls, ``run.joined`` as the fact
``joined:<name>`` (once, only with calls that have an outcome), and which calls in doubt hold a run
back. ``fold`` over the history rebuilds the same snapshot; ``CallTools`` refuses a malformed fan-out."""

from __future__ import annotations

import pytest

from longrun.domain import (
    ALL,
    FIRST,
    ActionConfirmed,
    ActionFailed,
    ActionPrepared,
    ActionSubmitted,
    ActionUnknown,
    ActionUnavailable,
    CallTool,
    CallTools,
    EffectKind,
    RunStatus,
    RunStatusChanged,
    at_least,
    budget_needs,
    fold,
    freeze,
    idempotency_key,
    joins,
)
from longrun.domain import events as ev
from longrun.errors import EventRejected

from .support import History

CALLS = ("a", "b", "c")


def fanned_out() -> History:
    """A running run whose three calls were prepared and submitted."""
    h = History()
    h.apply(RunStatusChanged, to=RunStatus.RUNNING, reason="leased")
    for name in CALLS:
        h.apply(ActionPrepared, logical_action=name, tool="put", tool_version="1",
                effect_kind=EffectKind.NON_IDEMPOTENT_WRITE, request_hash=f"h-{name}",
                idempotency_key=idempotency_key("run-1", name, attempt_scope=1))
        h.apply(ActionSubmitted, logical_action=name)
    return h


def fan(join: joins.Join = ALL) -> CallTools:
    return CallTools(calls=[CallTool(tool="put", args=freeze({"n": i}), logical_action=name)
                            for i, name in enumerate(CALLS)], join=join)


def test_calls_still_to_make_and_with_an_outcome() -> None:
    h = History()
    h.apply(RunStatusChanged, to=RunStatus.RUNNING, reason="leased")
    assert joins.to_make(h.snapshot, CALLS) == CALLS  # none made yet
    h = fanned_out()
    h.apply(ActionConfirmed, logical_action="a")
    h.apply(ActionFailed, logical_action="b", error="422")
    h.apply(ActionUnknown, logical_action="c", cause="timed out")
    assert joins.with_outcome(h.snapshot, CALLS) == ("a", "b")
    assert joins.to_make(h.snapshot, CALLS) == ()  # c is in doubt: only the reconciler settles it


def test_a_submitted_or_retryable_call_is_made_again_and_only_a_new_one_spends_budget() -> None:
    h = fanned_out()
    h.apply(ActionConfirmed, logical_action="a")
    assert joins.to_make(h.snapshot, CALLS) == ("b", "c")
    assert budget_needs(fan(), h.snapshot) == ()  # resent under their keys: charged when first made
    assert joins.charged(h.snapshot, CALLS) == 0
    h.apply(ActionUnavailable, logical_action="b", cause="503")
    assert budget_needs(fan(), h.snapshot) == ("tool_calls", "cost")
    assert joins.charged(h.snapshot, CALLS) == 1 and joins.charged(History().snapshot, CALLS) == 3


@pytest.mark.parametrize(("join", "outcomes", "by"), [
    (ALL, ("a", "b"), None),
    (ALL, ("c", "a", "b"), ("c", "a", "b")),
    (FIRST, (), None),
    (FIRST, ("b",), ("b",)),
    (at_least(2), ("c",), None),
    (at_least(2), ("c", "a"), ("c", "a")),
])
def test_a_join_is_satisfied_by_the_first_calls_to_have_an_outcome(
        join: joins.Join, outcomes: tuple[str, ...], by: tuple[str, ...] | None) -> None:
    h = fanned_out()
    for name in outcomes:
        h.apply(ActionConfirmed, logical_action=name)
    assert joins.satisfied_by(h.snapshot, CALLS, join, arrived=outcomes) == by


def test_outcomes_recorded_before_this_turn_come_first() -> None:
    h = fanned_out()
    for name in ("c", "b"):
        h.apply(ActionConfirmed, logical_action=name)
    assert joins.satisfied_by(h.snapshot, CALLS, FIRST, arrived=("c",)) == ("b",)


def test_run_joined_is_the_fact_decide_reads_and_is_recorded_once() -> None:
    h = fanned_out()
    h.apply(ActionConfirmed, logical_action="b")
    assert joins.joined(h.snapshot, "puts") is None
    h.apply(ev.RunJoined, join="puts", calls=CALLS, by=("b",))
    joined = joins.joined(h.snapshot, "puts")
    assert joined == joins.Joined("puts", CALLS, ("b",)) and joined.lost == ("a", "c")
    with pytest.raises(EventRejected, match="recorded already"):
        h.apply(ev.RunJoined, join="puts", calls=CALLS, by=("b",))
    assert fold(h.events) == h.snapshot


@pytest.mark.parametrize(("by", "why"), [(("a",), "has no outcome"), ((), "some of its calls"),
                                         (("z",), "some of its calls")])
def test_run_joined_names_only_calls_of_the_join_that_have_an_outcome(by: tuple[str, ...], why: str) -> None:
    h = fanned_out()
    h.apply(ActionConfirmed, logical_action="b")
    with pytest.raises(EventRejected, match=why):
        h.apply(ev.RunJoined, join="puts", calls=CALLS, by=by)


def test_a_call_in_doubt_holds_the_run_back_only_while_a_join_may_need_it() -> None:
    h = fanned_out()
    h.apply(ActionUnknown, logical_action="a", cause="timed out")
    h.apply(ActionConfirmed, logical_action="b")
    assert joins.holding(h.snapshot) == ("a",)  # nothing joined: the join may still need it
    h.apply(ev.RunJoined, join="puts", calls=CALLS, by=("b",))
    assert joins.holding(h.snapshot) == ()  # it lost the join
    # but no new effect, and no completion, while it is in doubt
    assert joins.holding(h.snapshot, settling=True) == ("a",)


@pytest.mark.parametrize(("calls", "join", "why"), [
    (("a",), ALL, "at least two calls"),
    (("a", "a"), ALL, "distinct logical actions"),
    (("a", "b"), at_least(3), "needs 1 to 2"),
    (("a", "b"), at_least(0), "needs 1 to 2"),
])
def test_a_malformed_fan_out_is_refused(calls: tuple[str, ...], join: joins.Join, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        CallTools(calls=[CallTool(tool="put", args=freeze({}), logical_action=c) for c in calls], join=join)


def test_a_join_is_named_by_its_author_or_after_its_calls() -> None:
    assert fan().join_name == "a+b+c"
    assert CallTools(calls=fan().calls, name="puts").join_name == "puts"
