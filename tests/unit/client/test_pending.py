"""How a client matches the answers to one run.create it sent, without a broker."""

from __future__ import annotations

from typing import Any

import pytest

from longrun_client import Envelope, RunRejected, make
from longrun_client.pending import PendingCreate, correlation_id_of

VERSIONS = {"workflow": "1", "prompt": "1", "model_policy": "1", "tool_schemas": "1"}


def _create(key: str = "k-1", correlation: str | None = None) -> Envelope:
    return make("run.create", {"workflow": "steps", "idempotency_key": key, "input": {"steps": 2}},
                producer="tests", tenant_id="acme", correlation_id=correlation)


def _answer(request: Envelope, type_: str, payload: dict[str, Any], *, causation: str | None = None) -> Envelope:
    return make(type_, payload, producer="scheduler", tenant_id="acme", run_id=payload.get("run_id"),
                correlation_id=correlation_id_of(request),
                causation_id=request.event_id if causation is None else causation)


def _status(run_id: str, seq: int, status: str, outcome: dict[str, Any] | None = None) -> Envelope:
    return make("run.event", {"seq": seq, "event_type": "run.status_changed", "status": status, "outcome": outcome},
                producer="worker", tenant_id="acme", run_id=run_id, correlation_id="k-1", causation_id="w-1")


def test_the_correlation_id_is_the_producers_else_the_idempotency_key() -> None:
    assert correlation_id_of(_create("k-1")) == "k-1"
    assert correlation_id_of(_create("k-1", "order-7")) == "order-7"


async def test_an_acceptance_names_the_run_whose_terminal_event_ends_the_create() -> None:
    request = _create()
    pending = PendingCreate(request)
    # Given an acceptance of another create with the same key (a repeated send), then of this one
    pending.offer(_answer(request, "run.accepted", {"run_id": "r-1", "idempotency_key": "k-1", "workflow": "steps",
                                                    "versions": VERSIONS}, causation="another-create"))
    assert not pending.answer.done()
    accepted = _answer(request, "run.accepted", {"run_id": "r-1", "idempotency_key": "k-1", "workflow": "steps",
                                                 "versions": VERSIONS})
    pending.offer(accepted)
    assert pending.accepted() == accepted
    # When the run moves on and ends
    pending.offer(_status("r-1", 2, "RUNNING"))
    pending.offer(_status("r-2", 9, "COMPLETED"))
    assert not pending.finished
    pending.offer(_status("r-1", 5, "COMPLETED", {"status": "COMPLETED", "acceptance": {"evidence": {"ok": 1}}}))
    # Then its outcome is the terminal event's
    outcome = pending.outcome()
    assert (outcome.status, outcome.acceptance.evidence if outcome.acceptance else None) == ("COMPLETED", {"ok": 1})


async def test_a_terminal_event_without_an_outcome_still_ends_the_create_with_its_status() -> None:
    request = _create()
    pending = PendingCreate(request)
    pending.offer(_answer(request, "run.accepted", {"run_id": "r-1", "idempotency_key": "k-1", "workflow": "steps",
                                                    "versions": VERSIONS}))
    pending.offer(_status("r-1", 4, "TIMED_OUT"))
    assert pending.outcome().status == "TIMED_OUT"


async def test_a_refusal_ends_the_create_and_raises_with_its_payload() -> None:
    request = _create()
    pending = PendingCreate(request)
    pending.offer(_answer(request, "run.rejected", {"code": "unknown_workflow", "reason": "no workflow 'steps'",
                                                    "idempotency_key": "k-1", "refused_event_id": request.event_id},
                          causation="some-delivery"))
    assert pending.finished
    with pytest.raises(RunRejected) as refused:
        pending.accepted()
    assert refused.value.rejection.code == "unknown_workflow"
    with pytest.raises(RunRejected):
        pending.outcome()


async def test_closing_settles_what_is_still_awaited() -> None:
    pending = PendingCreate(_create())
    pending.close()
    with pytest.raises(ConnectionError):
        pending.accepted()


async def test_a_repeat_accepted_with_the_outcome_of_a_run_that_had_ended_ends_the_create_at_once() -> None:
    request = _create()
    pending = PendingCreate(request)
    outcome = {"status": "COMPLETED", "terminal_reason": "acceptance check passed"}
    pending.offer(_answer(request, "run.accepted", {"run_id": "r-1", "idempotency_key": "k-1", "workflow": "steps",
                                                    "versions": VERSIONS, "repeated": True, "outcome": outcome}))
    assert pending.finished
    assert (pending.outcome().status, pending.outcome().terminal_reason) == ("COMPLETED", "acceptance check passed")
