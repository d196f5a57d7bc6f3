"""Worth running now, with real processes: the forge answers 503 to every call for 30 s under 50 runs.

The forge counts the calls it refused during its outage; the circuit breaker's settings bound them
(``call_bound``), and every run completes once the forge is back, with one effect per idempotency key.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.bus import topology
from longrun.bus.connection import Bus
from longrun.domain import RunStatus
from longrun.envelope import make
from tests.fault.scenario import EVERYTHING, Scenario
from tests.harness import Services
from tests.infra import Infra
from tests.integration.ensemble import goal

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

RUNS = 50
OUTAGE = 15.0
THRESHOLD, WINDOW, COOL_DOWN = 3, 5.0, 2.5
WORKERS, CONCURRENCY = 2, 4
ENV = {"LONGRUN_BREAKER_THRESHOLD": str(THRESHOLD), "LONGRUN_BREAKER_WINDOW": str(WINDOW),
       "LONGRUN_BREAKER_COOL_DOWN": str(COOL_DOWN), "LONGRUN_BREAKER_CACHE": "1",
       "LONGRUN_WORKER_CONCURRENCY": str(CONCURRENCY), "LONGRUN_TENANT_SLOTS": str(RUNS)}


def call_bound(outage: float) -> int:
    """What the breaker lets reach a far side that is down for ``outage`` seconds (docs/controls.md#tool-health):
    the ``THRESHOLD`` unavailable answers that open it; the calls already in flight when it opened, and
    those a worker starts before it hears so (it hears with its next unavailable answer, so each of
    these holds one of the worker's slots: at most twice the slots of all workers); and one probe per
    cool-down while it stays down, the first a cool-down after it opened, plus the one that finds it back."""
    slots = WORKERS * CONCURRENCY
    return THRESHOLD + 2 * slots + math.ceil(outage / COOL_DOWN) + 1


@pytest.fixture
async def scenario(clean: None, infra: Infra, engine: AsyncEngine, bus: Bus, services: Services,
                   tmp_path: Path) -> AsyncIterator[Scenario]:
    yield Scenario(services, infra, engine, bus, tmp_path)


async def forge(scenario: Scenario, method: str, path: str, **body: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=scenario.ensemble.forge_url, timeout=10) as http:
        response = await http.request(method, path, json=body or None)
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]


async def create_all(scenario: Scenario, count: int) -> list[str]:
    keys = [f"outage-{i:02d}-{time.monotonic_ns() % 10**6}" for i in range(count)]
    for key in keys:
        await scenario.publish(topology.INGRESS_EXCHANGE, "run.create", make(
            "run.create", {"workflow": "dependency_upgrade", "idempotency_key": key, "priority": 5,
                           "input": goal(key)}, producer="tests", tenant_id="acme"))

    async def created() -> list[str] | None:
        rows = await scenario.rows("SELECT run_id FROM runs WHERE tenant_id = 'acme'")
        return [r.run_id for r in rows] if len(rows) == count else None

    return await scenario.poll(created, timeout=60, what=f"{count} runs created")  # type: ignore[no-any-return]


@pytest.mark.long
async def test_fifty_runs_wait_out_a_forge_outage_within_the_breaker_s_call_bound(scenario: Scenario) -> None:
    # Given the ensemble with two workers, and a forge that answers 503 to everything for 15 s from now
    await scenario.up(*EVERYTHING, **ENV)
    for _ in range(WORKERS - 1):
        scenario.start("worker", **ENV)
    await forge(scenario, "POST", "/_control/unavailable", seconds=OUTAGE)
    started = time.monotonic()
    # When 50 dependency upgrades start at once
    run_ids = await create_all(scenario, RUNS)
    # Then while it is down they stop calling it: the breaker opens and the runs wait for it, uncharged
    await scenario.poll(lambda: scenario.scalar("SELECT state FROM tool_health WHERE far_side = 'forge'"),
                        timeout=30, what="the forge's breaker row")
    waiting = await scenario.poll(lambda: scenario.scalar(
        "SELECT count(*) FROM runs WHERE wait_kind = 'tool_healthy'"), timeout=30, what="runs waiting for the forge")
    assert waiting >= 1
    await asyncio.sleep(max(0.0, OUTAGE - (time.monotonic() - started)) + 0.5)
    outage = await forge(scenario, "GET", "/_control/unavailable")
    assert outage["remaining_seconds"] == 0
    bound = call_bound(OUTAGE)
    assert THRESHOLD <= outage["calls"] <= bound, f"the forge refused {outage['calls']} calls; the bound is {bound}"
    print(f"the forge refused {outage['calls']} calls in {OUTAGE:.0f}s under {RUNS} runs; the bound is {bound}")
    # And every run completes after it recovers, approved on the way, with one effect per key
    deadline = asyncio.get_running_loop().time() + 240
    pending = set(run_ids)
    while pending:
        for run_id in sorted(pending):
            stored = await scenario.stored(run_id)
            if stored.snapshot.status is RunStatus.COMPLETED:
                pending.discard(run_id)
            elif stored.snapshot.status is RunStatus.WAITING_USER:
                await scenario.approve(run_id)
            else:
                assert stored.snapshot.status not in (RunStatus.FAILED, RunStatus.NEEDS_ATTENTION,
                                                      RunStatus.BUDGET_EXHAUSTED), \
                    await scenario.explain(run_id, f"{run_id} ended {stored.snapshot.status.value}")
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(await scenario.explain(sorted(pending)[0], f"{len(pending)} runs not COMPLETED"))
        await asyncio.sleep(0.5)
    effects = await scenario.forge_effects()
    assert all(e["count"] == 1 for e in effects), [e for e in effects if e["count"] != 1]
    assert sum(1 for e in effects if e["kind"] == "merge_request") == RUNS
    assert (await forge(scenario, "GET", "/_control/unavailable"))["calls"] == outage["calls"]
    assert await scenario.scalar("SELECT state FROM tool_health WHERE far_side = 'forge'") == "CLOSED"
    # Each attempt the outage cost was charged: the tool calls used are the forge's calls plus the refused ones
    used = sum([(await scenario.stored(r)).snapshot.budget.used.tool_calls for r in run_ids])
    assert used == sum(e["count"] for e in effects) + outage["calls"]
    await scenario.finish()


@pytest.mark.long
async def test_a_lone_run_probes_a_long_outage_without_using_up_its_attempts(scenario: Scenario) -> None:
    # Given a breaker with a short cool-down and a retry policy of three attempts, and a forge down for
    # long enough to fail many more probes than that
    env = {**ENV, "LONGRUN_BREAKER_THRESHOLD": "1", "LONGRUN_BREAKER_COOL_DOWN": "1",
           "LONGRUN_RETRY_MAXIMUM_ATTEMPTS": "3"}
    await scenario.up(*EVERYTHING, **env)
    await forge(scenario, "POST", "/_control/unavailable", seconds=8)
    # When one upgrade starts: it is the only run waiting, so it carries every probe
    run_id = await scenario.create()
    # Then each probe that found the forge down was charged to it, and none used up its attempts:
    # it completes once the forge is back
    done = await scenario.to_the_end(run_id, timeout=90)
    assert done.snapshot.status is RunStatus.COMPLETED, done.snapshot.terminal_reason
    refused = (await forge(scenario, "GET", "/_control/unavailable"))["calls"]
    branch = done.snapshot.action("branch")
    assert branch is not None and branch.attempts == refused + 1 > 3
    assert refused <= 1 + 2 * CONCURRENCY + math.ceil(8 / 1) + 1
    assert await scenario.forge_counts() == {"branch": 1, "commit": 2, "ci_run": 2, "merge_request": 1}
    await scenario.finish()
