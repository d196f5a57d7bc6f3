"""Recovery: SIGKILL one of two workers under load; how long until each of its runs steps again.

Two workers, the reconciler (it re-wakes runs whose lease expired) and the rest of the
ensemble; runs of many steps keep both workers busy. At the kill, the runs whose
``lease_owner`` is the killed worker are the ones it held; for each, the time from the
kill until its next run event is recorded (by the surviving worker). Compared with the
lease TTL: the lease must expire, the reconciler must see it, the wakeup must travel.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.common import Knobs, percentiles
from bench.ensemble import Ensemble, Producer, reconciler_present
from bench.infra import Infra

RECOVERY_STEPS = 40
RECOVERY_RUNS = 128


async def sigkill_a_worker(infra: Infra, engine: AsyncEngine, knobs: Knobs) -> dict[str, Any]:
    if not reconciler_present():
        return {"measured": False, "reason": "not measured: reconciler missing (longrun.services.reconciler)"}
    ensemble = Ensemble(infra, engine, knobs, workers=2)
    try:
        services = await ensemble.start(count=False, reconciler=True)
        async with Producer(infra.amqp_url) as producer:
            await producer.burst([f"rec-{i:05d}" for i in range(RECOVERY_RUNS)], RECOVERY_STEPS)
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
        t_kill = time.time()
        victim.kill()
        async with engine.connect() as conn:
            held = {r.run_id: (r.last_seq, r.status) for r in (await conn.execute(text(
                "SELECT run_id, last_seq, status FROM runs WHERE lease_owner = 'worker-1'"))).all()}
        recovered: dict[str, float] = {}
        deadline = time.monotonic() + knobs.lease_ttl + 45
        while len(recovered) < len(held) and time.monotonic() < deadline:
            async with engine.connect() as conn:
                rows = (await conn.execute(text(
                    "SELECT run_id, seq, extract(epoch FROM recorded_at) AS at FROM run_events "
                    "WHERE run_id = ANY(:ids) AND recorded_at >= to_timestamp(:t) ORDER BY recorded_at"),
                    {"ids": [r for r in held if r not in recovered], "t": t_kill - 1})).all()
            for row in rows:
                if row.seq > held[row.run_id][0]:
                    recovered.setdefault(row.run_id, float(row.at) - t_kill)
            await asyncio.sleep(0.1)
        # When the reconciler cleared each lease: its wakeup's outbox row is written in that transaction.
        async with engine.connect() as conn:
            cleared = {r.aggregate_id: float(r.at) - t_kill for r in (await conn.execute(text(
                "SELECT aggregate_id, extract(epoch FROM min(created_at)) AS at FROM outbox "
                "WHERE aggregate_id = ANY(:ids) AND type = 'run.wakeup' "
                "AND payload -> 'payload' ->> 'reason' = 'lease expired' GROUP BY aggregate_id"),
                {"ids": list(held)})).all()}
        errors = {k: v for k, v in services.errors().items() if k != "worker-1"}
    finally:
        ensemble.stop()
    delays = list(recovered.values())
    stats = percentiles(delays, (50, 95))
    woken_to_step = [recovered[r] - cleared[r] for r in recovered if r in cleared]
    return {"measured": True, "runs_held_by_killed_worker": len(held), "recovered": len(recovered),
            "not_recovered": len(held) - len(recovered), "run_lease_ttl_s": knobs.lease_ttl,
            "partition_lease_ttl_s": 3, "reconcile_interval_s": 1,
            "next_step_after_kill_s": stats, "target_s": knobs.lease_ttl + 2,
            # Where the time goes: kill -> lease cleared and re-woken (lease TTL + reconciler sweep),
            # then re-woken -> next step (relay, partition takeover, the surviving worker).
            "lease_cleared_after_kill_s": percentiles(list(cleared.values()), (50, 95)),
            "next_step_after_rewake_s": percentiles(woken_to_step, (50, 95)), "service_errors": errors}
