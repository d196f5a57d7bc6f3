"""Recovery: SIGKILL one of two workers under load; how long until each of its runs steps again.

Two rows, each its own ensemble with the default lease settings (``LONGRUN_RUN_LEASE_TTL`` 30 s,
``LONGRUN_PARTITION_LEASE_TTL`` 6 s, the reconciler's interval 1 s): *between steps*, runs of many
trivial steps (``steps``: the worker dies between or inside commits), and *mid-call*, runs whose
every step's call is held ``held_steps.CALL_SECONDS`` (``held_steps``: the worker dies with its calls
in flight, which the survivor makes again). Two workers, the reconciler and the rest of the ensemble;
the runs keep both workers busy. At the kill, the runs whose ``lease_owner`` is the killed worker are
the ones it held; for each, the time from the kill until its next run event (the survivor's) is
recorded. The survivor takes them over once the killed worker's membership lapsed (its TTL, then
the survivor's look every second), not once their run leases expire: the target is
``LONGRUN_PARTITION_LEASE_TTL`` + 2 s.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from bench import held_steps
from bench.common import Knobs, percentiles
from bench.ensemble import Ensemble, Producer, reconciler_present
from bench.infra import Infra
from longrun.config import Settings

RECOVERY_STEPS = 40
RECOVERY_RUNS = 128
DEFAULTS = Settings.from_env({})
ROWS = {"between_steps": (None, "steps"), "mid_call": ("bench.held_steps:HELD_STEPS", held_steps.KIND)}
"""Row -> the services' ``LONGRUN_RUN_KINDS`` (None: the default) and the runs' workflow."""


async def sigkill_a_worker(infra: Infra, engine: AsyncEngine, knobs: Knobs) -> dict[str, Any]:
    if not reconciler_present():
        return {"measured": False, "reason": "not measured: reconciler missing (longrun.services.reconciler)"}
    rows = {name: await _row(infra, engine, knobs, run_kinds, workflow) for name, (run_kinds, workflow) in ROWS.items()}
    return {"measured": True, "run_lease_ttl_s": DEFAULTS.run_lease_ttl,
            "partition_lease_ttl_s": DEFAULTS.partition_lease_ttl, "reconcile_interval_s": DEFAULTS.reconcile_interval,
            "target_s": DEFAULTS.partition_lease_ttl + 2, "call_s": held_steps.CALL_SECONDS, **rows}


async def _row(infra: Infra, engine: AsyncEngine, knobs: Knobs, run_kinds: str | None, workflow: str) -> dict[str, Any]:
    ensemble = Ensemble(infra, engine, knobs, workers=2, run_kinds=run_kinds)
    try:
        services = await ensemble.start(count=False, reconciler=True, lease_ttl=DEFAULTS.run_lease_ttl,
                                        LONGRUN_PARTITION_LEASE_TTL=f"{DEFAULTS.partition_lease_ttl:g}",
                                        LONGRUN_RECONCILE_INTERVAL=f"{DEFAULTS.reconcile_interval:g}")
        async with Producer(infra.amqp_url) as producer:
            await producer.burst([f"rec-{i:05d}" for i in range(RECOVERY_RUNS)], RECOVERY_STEPS, workflow=workflow)
        # Mid-load: wait until both workers are stepping.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            async with engine.connect() as conn:
                owners = dict((await conn.execute(text(
                    "SELECT lease_owner, count(*) FROM runs WHERE lease_owner IS NOT NULL AND status = 'RUNNING' "
                    "GROUP BY lease_owner"))).all())
            if owners.get("worker-1", 0) >= 5 and owners.get("worker-0", 0) >= 5:
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        victim = services.procs["worker-1"]
        async with engine.connect() as conn:
            t_kill = float((await conn.execute(text("SELECT extract(epoch FROM clock_timestamp())"))).scalar_one())
        victim.kill()
        async with engine.connect() as conn:
            held = {r.run_id: r.last_seq for r in (await conn.execute(text(
                "SELECT run_id, last_seq FROM runs WHERE lease_owner = 'worker-1'"))).all()}
        recovered: dict[str, float] = {}
        deadline = time.monotonic() + DEFAULTS.run_lease_ttl + 45
        while len(recovered) < len(held) and time.monotonic() < deadline:
            async with engine.connect() as conn:
                rows = (await conn.execute(text(
                    "SELECT run_id, seq, extract(epoch FROM recorded_at) AS at FROM run_events "
                    "WHERE run_id = ANY(:ids) AND recorded_at >= to_timestamp(:t) ORDER BY recorded_at"),
                    {"ids": [r for r in held if r not in recovered], "t": t_kill - 1})).all()
            for row in rows:
                if row.seq > held[row.run_id]:
                    recovered.setdefault(row.run_id, float(row.at) - t_kill)
            await asyncio.sleep(0.1)
        # A run the reconciler re-woke after its lease expired was not taken over (the fallback).
        async with engine.connect() as conn:
            rewoken = int((await conn.execute(text(
                "SELECT count(DISTINCT aggregate_id) FROM outbox WHERE aggregate_id = ANY(:ids) "
                "AND type = 'run.wakeup' AND payload -> 'payload' ->> 'reason' = 'lease expired'"),
                {"ids": list(held)})).scalar_one())
        errors = {k: v for k, v in services.errors().items() if k != "worker-1"}
    finally:
        ensemble.stop()
    return {"workflow": workflow, "runs_held_by_killed_worker": len(held), "recovered": len(recovered),
            "not_recovered": len(held) - len(recovered), "rewoken_after_lease_expiry": rewoken,
            "next_step_after_kill_s": percentiles(list(recovered.values()), (50, 95)), "service_errors": errors}
