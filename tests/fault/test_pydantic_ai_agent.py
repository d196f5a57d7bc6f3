"""Row: a Pydantic AI agent's worker is SIGKILLed in the middle of the agent's write.

The run kind is ``tests/integration/agent_kinds.py``: a code-first function runs an agent that reads
notes (a read) and writes a brief (a non-idempotent write, found by its idempotency key). The write
acts, then holds its answer; the test kills the worker there by PID. The successor finds the write
submitted and not safely repeatable: UNKNOWN, settled by the reconciler's lookup; the agent's loop is
replayed from the journal (its model answers and the read's receipt), and the run completes.
"""

from __future__ import annotations

import json

import pytest

from longrun.domain import RunStatus
from tests.fault.scenario import Scenario

pytestmark = [pytest.mark.fault, pytest.mark.integration]


async def test_an_agent_whose_worker_dies_during_its_write_completes_with_one_effect(scenario: Scenario) -> None:
    # Given the briefing agent's far side (notes on "pricing"), and a worker whose writes hold their answer
    far_side = scenario.tmp / "far-side"
    (far_side / "notes").mkdir(parents=True)
    (far_side / "notes" / "pricing.txt").write_text("raise the starter plan to 12 EUR")
    kinds = {"LONGRUN_RUN_KINDS": "tests.integration.agent_kinds:kinds", "AGENT_FAR_SIDE": str(far_side)}
    await scenario.up("scheduler", "relay", "reconciler", forge=False, **kinds)
    doomed = scenario.start("worker", AGENT_WRITE_HOLD="60", **kinds)
    run_id = await scenario.create(workflow="briefing", input_={"topic": "pricing"})
    # When the write has acted and the worker is SIGKILLed before it answered
    await scenario.poll(lambda: _exists(far_side / "writing"), timeout=30, what="the brief written")
    doomed.kill()
    scenario.start("worker", **kinds)
    done = await scenario.until(run_id, RunStatus.COMPLETED, timeout=45)
    # Then the brief was written once, the write settled by its lookup, and the run completed with the
    # agent's answer naming that brief
    briefs = [json.loads(line) for line in (far_side / "briefs.jsonl").read_text().splitlines()]
    assert [(b["id"], b["text"]) for b in briefs] == [("brief-1", "In short: raise the starter plan to 12 EUR")]
    ledger = await scenario.ledger(run_id)
    write = next(row for name, row in ledger.items() if name.endswith(":briefs.write"))
    assert (write.status, write.attempts, write.idempotency_key) == ("CONFIRMED", 1, briefs[0]["key"])
    assert [t for t in await scenario.trail(run_id, write.logical_action)] == [
        "action.prepared", "action.submitted", "action.unknown", "action.reconciliation_started", "action.reconciled"]
    assert done.snapshot.acceptance is not None and done.snapshot.acceptance.unmet == ()
    assert done.snapshot.fact("receipt:" + write.logical_action).value["id"] == "brief-1"  # type: ignore[union-attr,index]
    # and the model's three answers were charged to the run's budget, their tokens and cost
    charges = [e["data"] for e in await scenario.events(run_id) if e["type"] == "budget.charged"]
    model_charges = [c for c in charges if c.get("model_calls")]
    assert len(model_charges) == 3 and all(c["tokens"] > 0 and c["cost"] > 0 for c in model_charges)
    assert done.snapshot.budget.used.model_calls == 3
    await scenario.finish()


async def _exists(path) -> bool:  # type: ignore[no-untyped-def]
    return path.exists()
