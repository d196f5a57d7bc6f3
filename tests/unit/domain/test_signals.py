"""Signals in the pure domain: a ``signal.received`` is the fact ``signal:<id>``; it ends a wait for a
signal of its name (and only that), is recorded without a wake otherwise, and after the run ended
is late: stored, not applied. ``fold`` over the history rebuilds the same snapshot."""

from __future__ import annotations

import pytest

from longrun.domain import (
    SIGNAL_FACT_PREFIX,
    DecisionContext,
    RunCompleted,
    RunPaused,
    RunResumed,
    RunStatus,
    RunStatusChanged,
    SignalReceived,
    WaitForSignal,
    WaitStarted,
    WakeReason,
    evolve,
    fold,
    freeze,
    is_late,
    received_signals,
    violations,
    wait_for,
    woken_by_signal,
)

from .support import History

S = RunStatus


def waiting_for(name: str) -> History:
    """A run whose worker's step decided ``WaitForSignal(name)``, as the worker writes it."""
    h = History()
    h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    ctx = DecisionContext(now=h.now, new_id=lambda: "w-1", rng=None)  # type: ignore[arg-type]
    status, wait = wait_for(WaitForSignal(name=name, deadline=h.now + 60), ctx)
    h.apply(WaitStarted, status=status, wait=wait)
    return h


def signal(h: History, signal_id: str, name: str, payload: object = None) -> SignalReceived:
    event = h.event(SignalReceived, signal_id=signal_id, name=name, payload=freeze(payload or {}),
                    sent_by="producer:ci")
    assert isinstance(event, SignalReceived)
    return event


def test_a_signal_wait_has_a_wake_condition_and_a_deadline() -> None:
    run = waiting_for("ship").snapshot
    assert run.status is S.WAITING_EVENT and run.wait is not None
    assert (run.wait.kind, run.wait.correlation_key, run.wait.deadline) == ("signal", "signal:ship", 62.0)
    assert violations(run) == ()


def test_the_signal_waited_for_ends_the_wait_and_is_recorded() -> None:
    h = waiting_for("ship")
    h.state = evolve(h.state, received := signal(h, "s-1", "ship", {"by": "ana"}))
    h.events.append(received)
    run = h.snapshot
    assert run.status is S.READY and run.last_wake is not None
    assert (run.last_wake.reason, run.last_wake.wait_id) == (WakeReason.SIGNAL, "w-1")
    fact = run.fact(SIGNAL_FACT_PREFIX + "s-1")
    assert fact is not None and fact.value == {"name": "ship", "payload": {"by": "ana"}}
    assert fact.source == "producer:ci"
    shipped = woken_by_signal(run)
    assert shipped is not None and (shipped.signal_id, shipped.payload) == ("s-1", {"by": "ana"})
    assert fold(h.events) == run


def test_another_signal_is_recorded_and_wakes_nothing() -> None:
    h = waiting_for("ship")
    before = h.snapshot
    h.apply(SignalReceived, signal_id="n-1", name="note", payload="later", sent_by="operator:ops")
    run = h.snapshot
    assert (run.status, run.wait) == (S.WAITING_EVENT, before.wait)
    assert [(s.name, s.payload) for s in received_signals(run)] == [("note", "later")]
    assert received_signals(run, "ship") == ()


def test_a_signal_while_running_is_recorded_for_decide_to_read() -> None:
    h = History()
    h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    h.apply(SignalReceived, signal_id="s-1", name="ship", payload=freeze({"by": "bo"}), sent_by="producer:ci")
    run = h.snapshot
    assert run.status is S.RUNNING and run.last_wake is None
    assert [s.signal_id for s in received_signals(run, "ship")] == ["s-1"]


def test_a_signal_to_a_paused_run_changes_what_it_resumes_to() -> None:
    h = waiting_for("ship")
    h.apply(RunPaused, by="ops", reason="maintenance")
    h.apply(SignalReceived, signal_id="s-1", name="ship", payload=freeze({"by": "ana"}), sent_by="producer:ci")
    assert (h.snapshot.status, h.snapshot.paused_from) == (S.PAUSED, S.READY)
    h.apply(RunResumed, by="ops", reason="done")
    assert h.snapshot.status is S.READY


def test_a_signal_after_the_run_ended_is_late_stored_not_applied() -> None:
    h = History()
    h.apply(RunStatusChanged, to=S.RUNNING, reason="leased")
    h.apply(RunCompleted, evidence=freeze({}))
    done = h.snapshot
    late = signal(h, "s-9", "ship", {"by": "late"})
    assert is_late(done, late)
    assert evolve(done, late) is done
    assert fold([*h.events, late]) == done


@pytest.mark.parametrize("name", ["note", "ship-it"])
def test_only_a_signal_of_the_waited_name_wakes(name: str) -> None:
    h = waiting_for("ship")
    h.apply(SignalReceived, signal_id="x", name=name, payload=None, sent_by="operator:ops")
    assert h.snapshot.status is S.WAITING_EVENT
