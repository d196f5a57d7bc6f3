"""Slots given back by parked runs and taken again, across a worker SIGKILL and a PostgreSQL restart.

A run parks on an open breaker and hands its slot on in one statement, and is queued again when the
breaker closes: whatever dies in between, the tenant's runs never hold more than its slots (sampled
from the runs table all along), every run completes, and the far side sees one effect per run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.bus.connection import Bus
from tests.fault.scenario import Scenario
from tests.harness import Services
from tests.infra import Infra, database_stopped
from tests.integration.test_slots_while_parked import (
    SERVICES,
    SLOTS,
    Gate,
    admitted_after_their_last_wake,
    completed,
    parked,
    sampling,
)

pytestmark = [pytest.mark.fault, pytest.mark.integration, pytest.mark.timeout(300)]

GATED, FREE = 4, 3


@pytest.fixture
async def scenario(clean: None, infra: Infra, engine: AsyncEngine, bus: Bus, services: Services,
                   tmp_path: Path) -> AsyncIterator[Scenario]:
    yield Scenario(services, infra, engine, bus, tmp_path)


async def test_parked_runs_give_slots_back_and_take_them_again_across_a_worker_kill_and_a_database_restart(
        scenario: Scenario, local_database: None, tmp_path: Path) -> None:
    # Given a tenant with two slots, and a far side that is down
    gate = Gate(tmp_path)
    gate.break_down()
    env = gate.env()
    await scenario.up(*SERVICES, forge=False, **env)
    async with sampling(scenario.engine) as sampler:
        # When four runs that call it park, giving their slots back (each parks in the statement
        # that hands its slot to the next of them)
        gated = [await scenario.create(workflow="gated", input_={"gated": True}) for _ in range(GATED)]
        await scenario.poll(lambda: parked(scenario, gated), timeout=60, what="every gated run parked")
        # and the worker is SIGKILLed while runs that call nothing are being admitted and run
        free = [await scenario.create(workflow="gated", input_={"gated": False}) for _ in range(FREE)]
        [worker] = scenario.running("worker")
        worker.kill()
        scenario.start("worker", **env)
        # and PostgreSQL restarts
        async with database_stopped():
            await asyncio.sleep(2)
        await scenario.engine.dispose()
        # Then the runs that call nothing complete while the others stay parked
        await completed(scenario, free, timeout=60)
        assert gate.calls() == []
        # And once the far side is back, the parked runs are queued again and complete, a worker
        # SIGKILLed again while they do
        gate.repair()
        await asyncio.sleep(1)
        [worker] = scenario.running("worker")
        worker.kill()
        scenario.start("worker", **env)
        await completed(scenario, gated, timeout=120)
    # with one effect each, admitted after the wake that ended their wait
    assert len(gate.calls()) == GATED
    assert await admitted_after_their_last_wake(scenario, gated) == []
    # and the tenant never held more than its slots
    assert sampler.samples > 50
    assert sampler.most <= SLOTS, f"{sampler.most} runs held a slot at once; the tenant has {SLOTS}"
    await scenario.finish()
