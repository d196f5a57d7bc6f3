"""Row: a parent's worker is SIGKILLed between starting its children and committing the step
(``worker.children_created``: the children created through admission and linked, in the step's
transaction, not yet committed). Nothing of the step was written: no child exists, and the successor
that takes the parent over starts each child once (their idempotency key and run id derive from
the parent and the child's name)."""

from __future__ import annotations

import pytest

from longrun.domain import RunStatus
from tests.fault.scenario import Scenario

pytestmark = [pytest.mark.fault, pytest.mark.integration]

KINDS = {"LONGRUN_RUN_KINDS": "tests.integration.child_kinds:kinds"}


async def test_a_parent_killed_before_committing_its_children_starts_each_once(scenario: Scenario) -> None:
    # Given a parent of three children and a worker armed to die with them created, uncommitted
    await scenario.up("scheduler", "relay", "timer", "reconciler", forge=False, **KINDS)
    doomed = scenario.start("worker", LONGRUN_CRASH_POINTS="worker.children_created", **KINDS)
    parent = await scenario.create(workflow="parent", input_={"children": 3, "leaf": {"mode": "complete"}})
    await scenario.crashed(doomed, "worker.children_created")
    # Then nothing of the step is on record: no child run, no link, no child_started
    assert await scenario.scalar("SELECT count(*) FROM runs WHERE run_id <> :p", p=parent) == 0
    assert await scenario.scalar("SELECT count(*) FROM children") == 0
    assert "run.child_started" not in [e["type"] for e in await scenario.events(parent)]
    # When a fresh worker takes the parent over
    scenario.start("worker", **KINDS)
    done = await scenario.until(parent, RunStatus.COMPLETED, timeout=40)
    # Then each child was started once, by the successor, and the parent completed with their outcomes
    assert await scenario.scalar("SELECT count(*) FROM runs WHERE run_id <> :p", p=parent) == 3
    assert await scenario.scalar("SELECT count(*) FROM children WHERE parent_run_id = :p", p=parent) == 3
    types = [e["type"] for e in await scenario.events(parent)]
    assert types.count("run.child_started") == 3 and types.count("run.child_ended") == 3
    evidence = done.snapshot.acceptance.evidence  # type: ignore[union-attr]
    assert {o["status"] for o in evidence["children"].values()} == {"COMPLETED"}  # type: ignore[union-attr,index]
    await scenario.finish()
