"""A concurrency key of limit one under faults: the worker running the key holder's call is killed
(SIGKILL) mid-call, and PostgreSQL restarts while the next runs wait for the key. The repository (the
far side of ``keyed.work``, ``tests/integration/keyed_kinds.py``) must never see two runs at once, and
every run completes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from longrun.domain import RunStatus
from tests.fault.scenario import Scenario
from tests.infra import database_stopped

pytestmark = [pytest.mark.fault, pytest.mark.integration, pytest.mark.timeout(240)]

KINDS = "tests.integration.keyed_kinds:kinds"
RUNS = 4
WORK = 2.0


def _calls(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _overlaps(calls: list[dict[str, Any]]) -> list[str]:
    """Runs whose calls overlap: each run's span from its first call's start to its last call's end."""
    spans: dict[str, list[float]] = {}
    for call in calls:
        span = spans.setdefault(call["run"], [call["at"], call["at"]])
        span[0], span[1] = min(span[0], call["at"]), max(span[1], call["at"])
    ordered = sorted(spans.items(), key=lambda item: item[1][0])
    return [f"{later} started at {b[0]:.3f} before {earlier} ended at {a[1]:.3f}"
            for (earlier, a), (later, b) in zip(ordered, ordered[1:]) if b[0] < a[1]]


async def test_a_key_of_limit_one_holds_through_a_worker_sigkill_and_a_database_restart(
        scenario: Scenario, local_database: None) -> None:
    # Given two workers, and four runs of one repository, each making a two-second call under the key
    calls = scenario.tmp / "keyed-calls.jsonl"
    calls.touch()
    env = {"LONGRUN_RUN_KINDS": KINDS, "KEYED_CALLS": str(calls), "LONGRUN_TENANT_SLOTS": str(RUNS)}
    await scenario.up("scheduler", "relay", "timer", "reconciler", "worker", forge=False, **env)
    scenario.start("worker", **env)
    run_ids = [await scenario.create(workflow="keyed_queue", input_={"repo": "acme/api", "work": WORK})
               for _ in range(RUNS)]
    # When the worker running the first call is killed in the middle of it
    first = await scenario.poll(lambda: _first_start(calls), timeout=30, what="the first call")
    owner = (await scenario.stored(first)).lease_owner
    [doomed] = [p for p in scenario.running("worker") if p.name == owner]
    doomed.kill()
    # and PostgreSQL restarts while the other runs wait for the key
    async with database_stopped():
        await asyncio.sleep(2)
    # Then every run completes, and the repository never saw two runs at once
    for run_id in run_ids:
        await scenario.until(run_id, RunStatus.COMPLETED, timeout=120)
    seen = _calls(calls)
    assert {c["run"] for c in seen if c["event"] == "end"} == set(run_ids)
    assert _overlaps(seen) == []
    # and no two runs held the key at once: each took it after the one before had ended
    held = await scenario.rows(
        "SELECT r.run_id, r.concurrency_held_at AS took, (SELECT max(e.recorded_at) FROM run_events e "
        "WHERE e.run_id = r.run_id AND e.type = 'run.completed') AS ended FROM runs r "
        "WHERE r.concurrency_key = 'repo:acme/api' ORDER BY r.concurrency_held_at")
    assert all(later.took >= earlier.ended for earlier, later in zip(held, held[1:])), held
    await scenario.finish()


async def _first_start(calls: Path) -> str | None:
    started = [c["run"] for c in _calls(calls) if c["event"] == "start"]
    return started[0] if started else None
