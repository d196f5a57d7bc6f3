"""``action.recorded``: a pure or read call and its answer in one event, folding as its five would."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from longrun.domain import (
    ActionConfirmed,
    ActionPrepared,
    ActionRecorded,
    ActionSubmitted,
    ApprovalDecided,
    BudgetCharged,
    EffectKind,
    FactRecorded,
    RunEvent,
    RunSnapshot,
    RunStatus,
    RunStatusChanged,
    Usage,
    Wait,
    WaitStarted,
    evolve,
    freeze,
)

from .support import History, json_values

AT = 1_000.0


def _fold(state: RunSnapshot, events: list[RunEvent]) -> RunSnapshot | str:
    """The snapshot after ``events``, or the name of the error that refused one of them."""
    try:
        for event in events:
            state = evolve(state, event)
    except Exception as e:  # noqa: BLE001 - the refusal itself is what is compared
        return type(e).__name__
    return state


def _five(s: RunSnapshot, call: dict[str, Any], answer: dict[str, Any]) -> list[RunEvent]:
    name, seq = call["logical_action"], s.last_seq
    return [
        ActionPrepared(seq=seq + 1, at=AT, **call),
        ActionSubmitted(seq=seq + 2, at=AT, logical_action=name),
        BudgetCharged(seq=seq + 3, at=AT, tool_calls=1),
        ActionConfirmed(seq=seq + 4, at=AT, logical_action=name, external_id=answer["external_id"],
                        receipt_ref=answer["receipt_ref"]),
        FactRecorded(seq=seq + 5, at=AT, key=f"receipt:{name}", value=answer["receipt"], source=f"tool:{call['tool']}"),
    ]


def _run(tool_calls_left: int, cost_left: float, status: RunStatus, approved_hash: str | None,
         earlier: tuple[str, str] | None) -> RunSnapshot:
    """A run in ``status`` with that much budget left, maybe an approval and an earlier call (name, key)."""
    h = History(budget=Usage(model_calls=5, tool_calls=3, cost=10.0))
    h.apply(RunStatusChanged, to=RunStatus.RUNNING, reason="leased")
    if approved_hash is not None:
        wait = Wait(wait_id="w", kind="approval", deadline=1e9, approval_id="ap", owner="u", approved_hash=approved_hash)
        h.apply(WaitStarted, status=RunStatus.WAITING_USER, wait=wait)
        h.apply(ApprovalDecided, approval_id="ap", approved=True, approved_hash=approved_hash, decided_by="u")
        h.apply(RunStatusChanged, to=RunStatus.RUNNING, reason="leased")
    if earlier is not None:
        h.apply(ActionPrepared, logical_action=earlier[0], tool="t", tool_version="1", effect_kind=EffectKind.PURE,
                idempotency_key=earlier[1], request_hash="h-earlier")
    h.apply(BudgetCharged, tool_calls=3 - tool_calls_left, cost=10.0 - cost_left)
    if status is not RunStatus.RUNNING and h.snapshot.status is RunStatus.RUNNING:
        h.apply(RunStatusChanged, to=status, reason="yield")
    return h.snapshot


calls = st.fixed_dictionaries({
    "logical_action": st.sampled_from(["step:0", "step:1"]),
    "tool": st.sampled_from(["echo", "lookup"]),
    "tool_version": st.just("1"),
    "effect_kind": st.sampled_from([EffectKind.PURE, EffectKind.READ]),
    "idempotency_key": st.sampled_from(["k-0", "k-1"]),
    "request_hash": st.sampled_from(["h-0", "h-earlier"]),
    "approval_id": st.sampled_from([None, "ap"]),
})
answers = st.fixed_dictionaries({
    "external_id": st.none() | st.text(max_size=6),
    "receipt_ref": st.none() | st.just("artifact://sha256:ab"),
    "receipt": json_values.map(freeze),
})


@given(call=calls, answer=answers, tool_calls_left=st.integers(0, 2), cost_left=st.sampled_from([0.0, 5.0]),
       status=st.sampled_from([RunStatus.RUNNING, RunStatus.READY]),
       approved_hash=st.sampled_from([None, "h-0", "h-other"]),
       earlier=st.sampled_from([None, ("step:0", "k-0"), ("other", "k-0"), ("other", "k-9")]))
def test_one_recorded_event_folds_as_the_five_it_stands_for(call: dict[str, Any], answer: dict[str, Any],
                                                             tool_calls_left: int, cost_left: float,
                                                             status: RunStatus, approved_hash: str | None,
                                                             earlier: tuple[str, str] | None) -> None:
    # Given a run in any of the situations a call can meet (budget left or not, approval or not,
    # an earlier call under the same name or key, a run no longer RUNNING)
    s = _run(tool_calls_left, cost_left, status, approved_hash, earlier)
    # When a call and its answer are applied as one action.recorded, and as the five events it stands for
    one = _fold(s, [ActionRecorded(seq=s.last_seq + 1, at=AT, **call, **answer)])
    five = _fold(s, _five(s, call, answer))
    # Then both give the same snapshot (but for the one revision and seq the single event takes), or
    # are refused for the same reason
    if isinstance(one, str) or isinstance(five, str):
        assert one == five
        return
    assert one.revision == s.revision + 1 and one.last_seq == s.last_seq + 1
    assert one.replace(revision=five.revision, last_seq=five.last_seq) == five


def test_a_recorded_call_is_confirmed_charged_and_its_receipt_kept() -> None:
    s = _run(2, 5.0, RunStatus.RUNNING, None, None)
    after = evolve(s, ActionRecorded(seq=s.last_seq + 1, at=AT, logical_action="step:0", tool="echo",
                                     tool_version="1", effect_kind=EffectKind.PURE, idempotency_key="k-0",
                                     request_hash="h-0", external_id="x-1", receipt=freeze({"step": 0})))
    record = after.action("step:0")
    assert record is not None and (record.status.value, record.attempts, record.external_id) == ("CONFIRMED", 1, "x-1")
    assert after.budget.used.tool_calls == s.budget.used.tool_calls + 1
    fact = after.fact("receipt:step:0")
    assert fact is not None and (fact.value, fact.source) == (freeze({"step": 0}), "tool:echo")
