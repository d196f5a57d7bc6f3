"""Row: tool permits held by a worker SIGKILLed mid-call are freed when its membership lapses, long
before its run leases expire, and the tenant's bound on its tool group is never exceeded; nor is it
when PostgreSQL restarts while both permits are held and runs wait for one.

A tenant's forge tools are bounded to two calls at once; one worker holds both permits (two slow
calls in flight) while four runs wait; a second worker joins and the first is SIGKILLed. Membership
lapses in two seconds, run leases in twenty: calls are made again within seconds (the reconciler
frees the dead worker's permits and wakes one waiter for each, and the second worker takes the dead
one's runs over), and every run completes."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from tests.fixtures import eventually
from tests.infra import database_stopped
from tests.integration.permit_kinds import most_in_flight
from tests.integration.test_rate_limits import MODULES, _rows
from tests.integration.test_tool_concurrency import GROUP, bound_tool_group, create, start

pytestmark = [pytest.mark.fault, pytest.mark.integration, pytest.mark.timeout(120)]

BOUND, RUNS = 2, 6
MEMBERSHIP_TTL, RUN_LEASE_TTL = 2, 20


async def test_a_dead_worker_s_permits_are_freed_when_its_membership_lapses_and_the_bound_holds(
        clean, engine, bus, services, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Given acme's forge tools bounded to two calls at once, one worker, and six runs of four-second calls
    await bound_tool_group(engine, "acme", GROUP, BOUND)
    calls, ensemble, options = start(services, tmp_path, workers=0, PERMIT_CALL_SECONDS="4",
                                     LONGRUN_RUN_LEASE_TTL=str(RUN_LEASE_TTL),
                                     LONGRUN_PARTITION_LEASE_TTL=str(MEMBERSHIP_TTL))
    doomed = ensemble.start("worker", MODULES["worker"], **options)
    for _ in range(RUNS):
        await create(bus, "acme")

    async def both_permits_held_and_four_waiting() -> bool:
        (row,) = await _rows(engine, "SELECT (SELECT count(*) FROM tool_permits WHERE holder = 'worker-0') AS held, "
                                     "(SELECT count(*) FROM runs WHERE wait_kind = 'tool_concurrency') AS waiting")
        return row.held == BOUND and row.waiting == RUNS - BOUND

    await eventually(both_permits_held_and_four_waiting, timeout=30, interval=0.05,
                     what="worker-0 holding both permits, four runs waiting")
    ensemble.start("worker", MODULES["worker"], **options)

    async def second_worker_live() -> bool:
        return bool(await _rows(engine, "SELECT 1 FROM service_members WHERE service = 'worker' "
                                        "AND instance_id = 'worker-1' AND alive_until > now()"))

    await eventually(second_worker_live, timeout=20, what="worker-1 a live member")
    held = await _rows(engine, "SELECT count(*) AS n FROM tool_permits WHERE holder = 'worker-0'")
    assert held[0].n == BOUND  # its two calls still in flight
    # When the worker holding both permits is SIGKILLed mid-call
    killed_at = time.time()
    doomed.kill()

    async def called_again() -> float | None:
        after = [c["at"] for c in map(json.loads, calls.read_text().splitlines())
                 if c["edge"] == "start" and c["at"] > killed_at]
        return min(after) if after else None

    # Then calls are made again within seconds: the permits were freed with the membership...
    first = await eventually(called_again, timeout=RUN_LEASE_TTL - 5, interval=0.05, what="a call after the kill")
    print(f"first call after the kill: {first - killed_at:.1f}s")
    assert first - killed_at < MEMBERSHIP_TTL + 5

    # (a lapsed holder's permits stop counting at once; the takeover may call again before the reconciler's
    # round deletes their rows)
    async def permits_freed() -> bool:
        return (await _rows(engine, "SELECT count(*) AS n FROM tool_permits WHERE holder = 'worker-0'"))[0].n == 0

    await eventually(permits_freed, timeout=MEMBERSHIP_TTL + 5, what="worker-0's permits freed")

    # ...and the dead worker's runs were taken over with it, long before their leases would expire
    async def none_left_to_the_dead() -> bool:
        return (await _rows(engine, "SELECT count(*) AS n FROM runs WHERE lease_owner = 'worker-0'"))[0].n == 0

    await eventually(none_left_to_the_dead, timeout=MEMBERSHIP_TTL + 5, what="worker-0's runs taken over")
    assert time.time() - killed_at < RUN_LEASE_TTL

    async def all_done() -> bool:
        (row,) = await _rows(engine, "SELECT count(*) FILTER (WHERE status = 'COMPLETED') AS done FROM runs")
        return row.done == RUNS

    # And every run completes...
    await eventually(all_done, timeout=60, what=f"{RUNS} runs COMPLETED")
    lines = calls.read_text().splitlines()
    # ...with never more than two calls in flight, the dead worker's counted until it died
    assert most_in_flight(lines, "acme", killed_at=killed_at) == BOUND
    assert await _rows(engine, "SELECT * FROM tool_permits") == []


async def test_the_bound_holds_through_a_database_restart_with_both_permits_held_and_runs_waiting(
        clean, engine, bus, services, tmp_path: Path, local_database: None) -> None:  # type: ignore[no-untyped-def]
    # Given acme's forge tools bounded to two calls at once, two workers, and six runs of three-second calls
    await bound_tool_group(engine, "acme", GROUP, BOUND)
    calls, _, _ = start(services, tmp_path, workers=2, PERMIT_CALL_SECONDS="3")
    for _ in range(RUNS):
        await create(bus, "acme")

    async def both_permits_held_and_four_waiting() -> bool:
        (row,) = await _rows(engine, "SELECT (SELECT count(*) FROM tool_permits) AS held, "
                                     "(SELECT count(*) FROM runs WHERE wait_kind = 'tool_concurrency') AS waiting")
        return row.held == BOUND and row.waiting == RUNS - BOUND

    await eventually(both_permits_held_and_four_waiting, timeout=30, interval=0.05,
                     what="both permits held, four runs waiting")
    # When PostgreSQL stops for 3 s mid-call (the calls end while it is down) and starts again
    async with database_stopped():
        await asyncio.sleep(3)
    await engine.dispose()

    async def all_done() -> bool:
        (row,) = await _rows(engine, "SELECT count(*) FILTER (WHERE status = 'COMPLETED') AS done FROM runs")
        return row.done == RUNS

    # Then every run completes, no permit is left behind...
    await eventually(all_done, timeout=90, what=f"{RUNS} runs COMPLETED")
    assert await _rows(engine, "SELECT * FROM tool_permits") == []
    # ...and the far side never had more than two of acme's calls in flight (no process died)
    assert most_in_flight(calls.read_text().splitlines(), "acme") == BOUND
