"""Rate limits under faults: a worker SIGKILLed while runs wait for their places, then PostgreSQL
stopped and started, and the far side still never sees more than the limit plus its burst in any
window; every run completes, each effect once per key."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import eventually
from tests.infra import database_stopped
from tests.integration.ensemble import Ensemble
from tests.integration.test_rate_limits import KINDS, MODULES, _create, _rows

pytestmark = [pytest.mark.fault, pytest.mark.integration, pytest.mark.timeout(240)]

PER_10S, BURST, RUNS = 20, 2, 40


async def test_a_limit_holds_through_a_worker_killed_mid_wait_and_a_database_restart(
        clean, engine, bus, services, tmp_path: Path, local_database: None) -> None:  # type: ignore[no-untyped-def]
    # Given the limited tool's ensemble with two workers and a reconciler, and 40 runs waiting in its line
    calls = tmp_path / "far-side.jsonl"
    calls.touch()
    ensemble = Ensemble(services, tmp_path)
    options = {"LONGRUN_RUN_KINDS": KINDS, "LIMITED_CALLS": str(calls), "LIMITED_PER_10S": str(PER_10S),
               "LIMITED_BURST": str(BURST), "LONGRUN_TENANT_SLOTS": str(RUNS), "LONGRUN_RECONCILE_INTERVAL": "1"}
    for name in ("scheduler", "relay", "timer"):
        ensemble.start(name, MODULES[name], **options)
    ensemble.start("reconciler", "longrun.services.reconciler", **options)
    doomed = ensemble.start("worker-0", MODULES["worker"], **options)
    ensemble.start("worker-1", MODULES["worker"], **options)
    for i in range(RUNS):
        await _create(bus, ("acme", "globex")[i % 2], {})

    async def parked() -> bool:
        (row,) = await _rows(engine, "SELECT count(*) AS n FROM runs WHERE wait_kind = 'rate_limit'")
        return row.n >= RUNS // 2

    await eventually(parked, timeout=30, what="runs waiting for their places")
    # When one worker is SIGKILLed, and a few seconds later PostgreSQL stops for 3 s and starts again
    doomed.kill()
    await asyncio.sleep(3)
    async with database_stopped():
        await asyncio.sleep(3)
    await engine.dispose()

    async def all_done() -> bool:
        (row,) = await _rows(engine, "SELECT count(*) FILTER (WHERE status = 'COMPLETED') AS done, count(*) AS n "
                                     "FROM runs WHERE workflow = 'limited'")
        return row.n == RUNS and row.done == RUNS

    # Then every run completes, each call made once per key...
    await eventually(all_done, timeout=150, what=f"{RUNS} runs COMPLETED")
    seen: list[dict[str, Any]] = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len({c["key"] for c in seen}) == RUNS
    # ...and in no 10 s window did the far side see more than the limit plus its burst
    times = sorted(c["at"] for c in seen)
    worst = max(sum(1 for t in times if start <= t < start + 10) for start in times)
    assert worst <= PER_10S + BURST, [round(t - times[0], 2) for t in times]
