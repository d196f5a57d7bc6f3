"""Tool concurrency with real processes: a tenant whose tool group is bounded to two calls at once
runs eight runs of a slow tool on two workers, beside a tenant without a bound.

The tool's far side (``permit_kinds``) writes down when each call starts and ends: the bounded
tenant never has more than two in flight, the other is not held, the runs that wait say what for,
and every run completes, each waiting run woken once per permit freed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, new_key
from tests.integration.identities import bearer
from tests.integration.permit_kinds import most_in_flight
from longrun.bus import topology
from longrun.bus.codec import broker_user, to_message
from longrun.db import outbox
from longrun.envelope import make
from tests.integration.test_rate_limits import MODULES, _rows

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

KINDS = "tests.integration.permit_kinds:kinds"
BOUND, RUNS, OTHERS, WORKERS = 2, 8, 4, 2
GROUP = "forge.*"


async def bound_tool_group(engine: Any, tenant: str, group: str, bound: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("INSERT INTO tenant_limits (tenant_id, version, tool_concurrency, updated_by) "
                                "VALUES (:t, 1, CAST(:c AS jsonb), 'tests')"), {"t": tenant, "c": json.dumps({group: bound})})


async def create(bus: Any, tenant: str) -> None:
    envelope = make("run.create", {"workflow": "permitted", "idempotency_key": new_key(), "input": {}},
                    producer="tests", tenant_id=tenant)
    await bus.publish(topology.INGRESS_EXCHANGE, "run.create", to_message(envelope, user_id=broker_user(bus.url)))


def start(services: Any, tmp_path: Path, *, workers: int, **env: str) -> tuple[Path, Ensemble, dict[str, str]]:
    """The ensemble running ``permit_kinds`` (with a reconciler and ``workers`` workers), its far side's
    file and the services' settings."""
    calls = tmp_path / "far-side.jsonl"
    calls.touch()
    ensemble = Ensemble(services, tmp_path)
    options = {"LONGRUN_RUN_KINDS": KINDS, "PERMIT_CALLS": str(calls), "LONGRUN_TENANT_SLOTS": "20",
               "LONGRUN_RECONCILE_INTERVAL": "1", **env}
    for name in ("scheduler", "relay", "timer", "gateway"):
        ensemble.start(name, MODULES[name], **options)
    ensemble.start("reconciler", "longrun.services.reconciler", **options)
    for _ in range(workers):
        ensemble.start("worker", MODULES["worker"], **options)
    return calls, ensemble, options


@pytest.mark.long
async def test_a_bounded_tool_group_has_at_most_its_bound_in_flight_across_two_workers(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given acme's forge tools bounded to two calls at once, globex's not, and two workers
    await bound_tool_group(engine, "acme", GROUP, BOUND)
    calls, ensemble, _ = start(services, tmp_path, workers=WORKERS, PERMIT_CALL_SECONDS="1")
    operator = await bearer(engine, "ana", "admin")
    # When eight runs of acme and four of globex each call the slow tool, all at once
    started = time.monotonic()
    for i in range(RUNS + OTHERS):
        await create(bus, "acme" if i < RUNS else "globex")

    async def parked() -> list[str]:
        return [r.run_id for r in await _rows(engine, "SELECT run_id FROM runs WHERE tenant_id = 'acme' "
                                                      "AND wait_kind = 'tool_concurrency'")]

    # Then acme's runs past the bound wait for a permit, holding no slot, and say so
    waiting = await eventually(parked, timeout=30, interval=0.05, what="acme's runs waiting for a permit")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, headers=operator, timeout=10) as gateway:
        listed = (await gateway.get("/runs", params={"waiting_for": f"tool_concurrency:{GROUP}"})).json()
        views = [(await gateway.get(f"/runs/{run_id}")).json() for run_id in waiting]
    held_views = [v for v in views if (v["snapshot"]["wait"] or {}).get("kind") == "tool_concurrency"]
    assert held_views and {v["waiting_for"] for v in held_views} == {f"tool_concurrency:{GROUP}"}, views
    assert listed["runs"] and {(r["tenant_id"], r["wait_kind"]) for r in listed["runs"]} == {
        ("acme", "tool_concurrency")}, listed

    async def all_done() -> bool:
        (row,) = await _rows(engine, "SELECT count(*) FILTER (WHERE status = 'COMPLETED') AS done, count(*) AS n "
                                     "FROM runs WHERE workflow = 'permitted'")
        return row.n == RUNS + OTHERS and row.done == RUNS + OTHERS

    # And every run completes
    await eventually(all_done, timeout=60, what=f"{RUNS + OTHERS} runs COMPLETED")
    print(f"{RUNS + OTHERS} runs in {time.monotonic() - started:.1f}s")
    lines = calls.read_text().splitlines()
    assert sorted(json.loads(line)["edge"] for line in lines).count("end") == RUNS + OTHERS
    # acme never had more than two calls in flight, and had two at once (the bound is used)...
    assert most_in_flight(lines, "acme") == BOUND
    # ...while globex, bounded by nothing, was held by nothing: its calls overlapped past acme's bound
    assert most_in_flight(lines, "globex") > BOUND
    held = await _rows(engine, "SELECT r.tenant_id, count(*) AS n FROM run_events e JOIN runs r USING (run_id) "
                               "WHERE e.type = 'run.wait_started' AND e.data #>> '{wait,kind}' = 'tool_concurrency' "
                               "GROUP BY r.tenant_id")
    assert [r.tenant_id for r in held] == ["acme"]
    # Each wait was ended by a freed permit (one wake per permit: no herd, no polling), and none is held now
    woken = await _rows(engine, "SELECT count(*) AS n FROM run_events WHERE type = 'run.woken' "
                                "AND data ->> 'correlation_key' = :k", k=f"tool_concurrency:{GROUP}")
    assert held[0].n <= woken[0].n <= RUNS, (held, woken)
    # Woken queued (the wait held no slot), each was admitted and woken by admission, told at once: no
    # worker was sent a wakeup for it, which it would have refused
    wakeups = [outbox.envelope_of(r.type, r.payload)
               for r in await _rows(engine, "SELECT type, payload FROM outbox WHERE type = 'run.wakeup'")]
    assert [w["payload"]["reason"] for w in wakeups if w["payload"]["reason"].endswith("a permit was freed")] == []
    assert await _rows(engine, "SELECT * FROM tool_permits") == []
