"""Rows: tenant slots and budgets hold through a worker SIGKILLed right after it charged a model call,
and through a PostgreSQL restart under queued and running runs. Each row samples the tenant's
admitted open runs all along (never more than its slots), then checks the period's use (each model
call charged once: a killed worker's charge is neither lost nor repeated) and, with the budget spent,
that nothing more of the tenant was admitted."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.exc import SQLAlchemyError

from longrun.domain import RunStatus
from tests.fault.scenario import Scenario
from tests.infra import database_stopped
from tests.integration.budget_kinds import TOKENS_PER_CALL

pytestmark = [pytest.mark.fault, pytest.mark.integration]

KINDS = {"LONGRUN_RUN_KINDS": "tests.integration.budget_kinds:kinds"}
SERVICES = ("scheduler", "relay", "reconciler", "timer")
HOLDING = ("SELECT count(*) FROM runs WHERE tenant_id = 'acme' AND admitted_at IS NOT NULL "
           "AND status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED', 'TERMINATED', 'TIMED_OUT', 'BUDGET_EXHAUSTED')")


async def _limits(scenario: Scenario, *, slots: int, tokens: int) -> None:
    await scenario.execute("INSERT INTO tenant_limits (tenant_id, version, run_slots, token_budget, updated_by) "
                           "VALUES ('acme', 1, :s, :k, 'fault-tests')", s=slots, k=tokens)


@contextlib.asynccontextmanager
async def _most_held(scenario: Scenario) -> AsyncIterator[list[int]]:
    """The most runs of acme holding a slot at once (``[0]``) and how many samples were answered
    (``[1]``), sampled every 50 ms while the body runs (a sample the database cannot answer, it being
    down, is skipped). A run may hold its slot for less than a sample's interval: the samples bound
    what was held, they need not see it."""
    most = [0, 0]

    async def sample() -> None:
        while True:
            # (SQLAlchemyError, not only DBAPIError: a restart also ends pooled connections mid-checkout)
            with contextlib.suppress(SQLAlchemyError, OSError):
                most[0] = max(most[0], int(await scenario.scalar(HOLDING)))
                most[1] += 1
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    try:
        yield most
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)


async def _use(scenario: Scenario) -> tuple[int, bool]:
    row = (await scenario.rows("SELECT tokens, spent FROM tenant_budget_use WHERE tenant_id = 'acme'"))[0]
    return row.tokens, row.spent


async def test_a_worker_killed_right_after_charging_a_model_call_neither_loses_nor_repeats_the_charge(
        scenario: Scenario) -> None:
    # Given acme with 1 slot and a budget of two model calls' tokens, and a worker armed to die right
    # after its first commit (the first run's model call and its charge)
    await scenario.up(*SERVICES, forge=False, **KINDS)
    await _limits(scenario, slots=1, tokens=2 * TOKENS_PER_CALL)
    doomed = scenario.start("worker", LONGRUN_CRASH_POINTS="worker.after_commit:1", **KINDS)
    async with _most_held(scenario) as most:
        first = await scenario.create(workflow="thinker", input_={})
        second = await scenario.create(workflow="thinker", input_={})
        # When it dies there and a fresh worker takes over
        await scenario.crashed(doomed, "worker.after_commit")
        assert await _use(scenario) == (TOKENS_PER_CALL, False)
        scenario.start("worker", **KINDS)
        # Then both runs complete, one after the other in the one slot
        for run_id in (first, second):
            await scenario.until(run_id, RunStatus.COMPLETED, timeout=30)
        # and a third, created once the budget is spent, is not admitted
        third = await scenario.create(workflow="thinker", input_={})
        await asyncio.sleep(1.5)
    assert most[0] <= 1 and most[1] >= 20, most  # never more than its one slot, all along
    assert await _use(scenario) == (2 * TOKENS_PER_CALL, True)  # each call charged once
    assert (await scenario.stored(third)).admitted is False
    await scenario.finish(settled=False)


async def test_the_database_restarted_under_queued_and_running_runs_keeps_slots_and_budget(
        scenario: Scenario, local_database: None) -> None:
    # Given acme with 1 slot and a budget of four model calls' tokens, and six of its runs asked for
    await scenario.up(*SERVICES, "worker", forge=False, **KINDS)
    await _limits(scenario, slots=1, tokens=4 * TOKENS_PER_CALL)
    async with _most_held(scenario) as most:
        runs = [await scenario.create(workflow="thinker", input_={}) for _ in range(6)]
        # When PostgreSQL stops for a few seconds and starts again
        async with database_stopped():
            await asyncio.sleep(2)
        await scenario.engine.dispose()

        # Then every service rides it out: four runs complete, spending the budget exactly
        async def four_done() -> bool:
            statuses = [(await scenario.stored(r)).snapshot.status for r in runs]
            return statuses.count(RunStatus.COMPLETED) == 4

        await scenario.poll(four_done, timeout=60, what="four runs completed")
        await asyncio.sleep(1.5)
    # and acme never held more than its slot, and the two others wait, not admitted
    assert most[0] <= 1 and most[1] >= 20, most  # never more than its one slot, all along
    assert await _use(scenario) == (4 * TOKENS_PER_CALL, True)
    waiting = [r for r in runs if (await scenario.stored(r)).snapshot.status is not RunStatus.COMPLETED]
    assert len(waiting) == 2 and not any([(await scenario.stored(r)).admitted for r in waiting])
    await scenario.finish(settled=False)
