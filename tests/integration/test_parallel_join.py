"""A fan-out with a first join on the real services: the run goes on from the call that answered first at
once, while the calls that lost the join still run to their outcome and are recorded, each once, before
the run completes (``join_kinds``' far side holds item i 0.3 s plus 1 s times i)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from longrun.domain import RunStatus
from tests.fault.scenario import Scenario
from tests.integration.join_kinds import NEXT, far_side_log

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.mark.long
async def test_a_first_join_goes_on_from_the_first_answer_while_the_losers_run_and_are_recorded(
        scenario: Scenario, tmp_path: Path) -> None:
    # Given the fanned kind on the real services, its far side answering put:0 fast, put:1 and put:2 slowly
    far = tmp_path / "far-side.jsonl"
    far.touch()
    env = {"LONGRUN_RUN_KINDS": "tests.integration.join_kinds:kinds", "JOIN_FAR_SIDE": str(far),
           "JOIN_HOLD_SECONDS": "0.3", "JOIN_STAGGER_SECONDS": "1.0"}
    await scenario.up("scheduler", "relay", "reconciler", "worker", forge=False, **env)
    # When a run fans out three writes joined on the first answer, then makes one more write
    run_id = await scenario.create(workflow="fanned", input_={"calls": 3, "join": "first", "then_call": True})
    done = await scenario.until(run_id, RunStatus.COMPLETED, timeout=30)
    # Then put:0 satisfied the join, and the run went on from it (its next write made and answered)
    # before the losers answered
    events = [(e["type"], e["data"].get("logical_action")) for e in await scenario.events(run_id)]
    joined = next(e for e in await scenario.events(run_id) if e["type"] == "run.joined")
    assert (joined["data"]["by"], joined["data"]["calls"]) == (["put:0"], ["put:0", "put:1", "put:2"])
    confirmed = [name for kind, name in events if kind == "action.confirmed"]
    assert confirmed == ["put:0", NEXT, "put:1", "put:2"]
    assert events.index(("action.confirmed", "put:0")) < events.index(("run.joined", None)) \
        < events.index(("action.submitted", NEXT)) < events.index(("action.confirmed", "put:1"))
    # and the losers ran to their outcome and were recorded before the completion, each with one effect
    assert events.index(("action.confirmed", "put:2")) < events.index(("run.completed", None))
    ledger = await scenario.ledger(run_id)
    assert {name: row.status for name, row in ledger.items()} == dict.fromkeys(
        ("put:0", "put:1", "put:2", NEXT), "CONFIRMED")
    effects = Counter(line["key"] for line in far_side_log(far) if line["edge"] == "effect")
    assert set(effects) == {row.idempotency_key for row in ledger.values()} and set(effects.values()) == {1}
    assert done.snapshot.acceptance is not None and done.snapshot.acceptance.evidence["by"] == ("put:0",)
    await scenario.finish()
