"""Both state machines, pair by pair: the declared tables are exactly what the checks allow."""

from __future__ import annotations

import itertools

import pytest

from longrun.domain import (
    ACTION_TRANSITIONS,
    OPEN,
    RUN_TRANSITIONS,
    TERMINAL,
    WAITING,
    ActionStatus,
    RunStatus,
    check_action_transition,
    check_run_transition,
)
from longrun.errors import IllegalTransition

RUN_PAIRS = list(itertools.product(RunStatus, repeat=2))
ACTION_PAIRS = list(itertools.product(ActionStatus, repeat=2))


@pytest.mark.parametrize(("from_", "to"), RUN_PAIRS, ids=[f"{a.value}->{b.value}" for a, b in RUN_PAIRS])
def test_run_transition_is_allowed_exactly_when_the_table_says_so(from_: RunStatus, to: RunStatus) -> None:
    if to in RUN_TRANSITIONS[from_]:
        check_run_transition(from_, to)
        return
    with pytest.raises(IllegalTransition) as caught:
        check_run_transition(from_, to)
    assert caught.value.machine == "run"
    assert (caught.value.from_state, caught.value.to_state) == (from_.value, to.value)
    assert from_.value in str(caught.value) and to.value in str(caught.value)


@pytest.mark.parametrize(("from_", "to"), ACTION_PAIRS, ids=[f"{a.value}->{b.value}" for a, b in ACTION_PAIRS])
def test_action_transition_is_allowed_exactly_when_the_table_says_so(
    from_: ActionStatus, to: ActionStatus
) -> None:
    if to in ACTION_TRANSITIONS[from_]:
        check_action_transition(from_, to)
        return
    with pytest.raises(IllegalTransition) as caught:
        check_action_transition(from_, to)
    assert caught.value.machine == "action"
    assert from_.value in str(caught.value) and to.value in str(caught.value)


def test_every_status_has_a_row_and_no_status_loops_to_itself() -> None:
    assert set(RUN_TRANSITIONS) == set(RunStatus)
    assert set(ACTION_TRANSITIONS) == set(ActionStatus)
    assert all(s not in RUN_TRANSITIONS[s] for s in RunStatus)
    assert all(s not in ACTION_TRANSITIONS[s] for s in ActionStatus)


def test_a_terminal_run_never_reopens() -> None:
    assert TERMINAL == {
        RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED,
        RunStatus.TERMINATED, RunStatus.TIMED_OUT, RunStatus.BUDGET_EXHAUSTED,
    }  # fmt: skip
    for status in TERMINAL:
        assert RUN_TRANSITIONS[status] == frozenset()


def test_outside_impositions_reach_every_open_status() -> None:
    for status in OPEN:
        imposed = {RunStatus.TERMINATED, RunStatus.TIMED_OUT, RunStatus.BUDGET_EXHAUSTED}
        assert imposed <= RUN_TRANSITIONS[status]
        if status is not RunStatus.CANCELLING:
            assert RunStatus.CANCELLING in RUN_TRANSITIONS[status]
        if status not in (RunStatus.CANCELLING, RunStatus.PAUSED):
            assert RunStatus.PAUSED in RUN_TRANSITIONS[status]


def test_only_workers_complete_or_fail_a_run_and_only_cancelling_ends_cancelled() -> None:
    # Given the table, When we list who can reach each outcome, Then it is the worker step (or an operator).
    reach = {to: {f for f in RunStatus if to in RUN_TRANSITIONS[f]} for to in TERMINAL}
    assert reach[RunStatus.COMPLETED] == {RunStatus.RUNNING}
    assert reach[RunStatus.FAILED] == {RunStatus.RUNNING, RunStatus.NEEDS_ATTENTION}
    assert reach[RunStatus.CANCELLED] == {RunStatus.CANCELLING}


def test_waiting_statuses_are_left_only_by_a_wake_or_an_imposition() -> None:
    for status in WAITING:
        outside = RUN_TRANSITIONS[RunStatus.READY] - {RunStatus.RUNNING}
        assert RUN_TRANSITIONS[status] - {RunStatus.READY} == outside


def test_a_timeout_is_never_a_failure_for_an_action() -> None:
    assert ActionStatus.FAILED in ACTION_TRANSITIONS[ActionStatus.SUBMITTED]
    assert ActionStatus.UNKNOWN in ACTION_TRANSITIONS[ActionStatus.SUBMITTED]
    assert ActionStatus.FAILED not in ACTION_TRANSITIONS[ActionStatus.RECONCILING]
    assert ACTION_TRANSITIONS[ActionStatus.UNKNOWN] == {ActionStatus.RECONCILING}


def test_a_failed_action_moves_only_when_an_operator_retries_it_and_nothing_else_is_retried() -> None:
    assert ACTION_TRANSITIONS[ActionStatus.FAILED] == {ActionStatus.RETRYABLE}
    with pytest.raises(IllegalTransition, match="CONFIRMED.*RETRYABLE"):
        check_action_transition(ActionStatus.CONFIRMED, ActionStatus.RETRYABLE)
