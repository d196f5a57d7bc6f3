"""Time and waiting: 10,000 timers due at once, and 10,000 runs parked for free.

Parked runs are folded from their domain events (RunCreated -> RUNNING -> WaitStarted)
and inserted in bulk with ``runs.projection`` — the same rows ``runs.append`` writes —
with the timers ``ports.runs.wait_timers`` would make for them.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.common import CpuWatch, Knobs, percentiles, postgres_and_broker_pids, rss_kib
from bench.ensemble import reconciler_present
from bench.infra import Infra, Services
from bench.profile import Sampler
from longrun.bus import topology
from longrun.db import runs
from longrun.db.schema import run_events
from longrun.db.schema import runs as runs_table
from longrun.db.schema import timers as timers_table
from longrun.domain import PinnedVersions, RunStatus, Usage, Wait, fold, freeze
from longrun.domain import events as ev

TENANT = "bench-parked"
VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="bench-v1")
CHUNK = 2_500


async def insert_parked(engine: AsyncEngine, n: int, *, status: RunStatus, partitions: int,
                        wake_in: float | None = None, deadline_in: float = 3600, prefix: str = "run-parked",
                        start: int = 0) -> None:
    """``n`` runs parked in ``status`` (WAITING_EVENT on a correlation key, or RETRY_SCHEDULED), numbered
    from ``start``; built and written a chunk at a time, so a million take no more memory than one."""
    at = time.time()
    for first in range(start, start + n, CHUNK):
        rows = [_parked(i, at, status=status, partitions=partitions, wake_in=wake_in, deadline_in=deadline_in,
                        prefix=prefix) for i in range(first, min(first + CHUNK, start + n))]
        async with engine.begin() as conn:
            await conn.execute(insert(runs_table), [run for run, _, _ in rows])
            await conn.execute(insert(run_events), [e for _, events, _ in rows for e in events])
            timer_rows = [timer for _, _, timer in rows if timer is not None]
            if timer_rows:
                await conn.execute(insert(timers_table), timer_rows)


def _parked(i: int, at: float, *, status: RunStatus, partitions: int, wake_in: float | None, deadline_in: float,
            prefix: str) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any] | None]:
    """One parked run's row, its events and (waiting on an event) its deadline timer."""
    run_id = f"{prefix}-{i:07d}"
    if status is RunStatus.WAITING_EVENT:
        wait = Wait(wait_id=f"w-{i}", kind="ci", deadline=at + deadline_in, correlation_key=f"ci:{run_id}")
    else:
        assert wake_in is not None
        wait = Wait(wait_id=f"w-{i}", kind="timer", deadline=at + wake_in, wake_at=at + wake_in)
    history = [
        ev.RunCreated(seq=1, at=at, run_id=run_id, tenant_id=TENANT, kind="steps", goal=freeze({"steps": 3}),
                      versions=VERSIONS, budget=Usage(model_calls=50, tool_calls=200, cost=10.0)),
        ev.RunStatusChanged(seq=2, at=at, to=RunStatus.RUNNING, reason="taken by bench"),
        ev.WaitStarted(seq=3, at=at, status=status, wait=wait),
    ]
    snapshot = fold(history)
    run = {"run_id": run_id, "tenant_id": TENANT, "idempotency_key": run_id, "input_hash": "h",
           "workflow": "steps", "workflow_version": "1", "prompt_version": "none", "model_policy_version": "none",
           "tool_schema_version": "bench-v1", "partition": topology.partition_of(run_id, partitions),
           "last_seq": 3, "admitted_at": datetime.fromtimestamp(at, UTC), **runs.projection(snapshot)}
    events = [{"run_id": run_id, "seq": e.seq, "event_id": f"{run_id}:{e.seq}", "type": e.type,
               "data": ev.event_to_dict(e), "applied": True, "occurred_at": datetime.fromtimestamp(e.at, UTC)}
              for e in history]
    timer = None
    if status is RunStatus.WAITING_EVENT:  # its deadline, as ports.runs.wait_timers makes it
        timer = {"timer_key": f"{run_id}:{wait.wait_id}:deadline", "run_id": run_id, "kind": "wait_deadline",
                 "wake_at": datetime.fromtimestamp(wait.deadline, UTC),
                 "payload": {"wait_id": wait.wait_id, "reason": "deadline"}}
    return run, events, timer


async def timers_due_at_once(infra: Infra, engine: AsyncEngine, knobs: Knobs) -> dict[str, Any]:
    """N runs in RETRY_SCHEDULED whose timers all come due at the same instant; one timer service.

    The profile comes from a second, smaller burst: py-spy's own CPU (about 15 % of a core at its
    200 samples/s) would otherwise compete with the timer and PostgreSQL in the measured one."""
    await infra.reset(engine)
    n = knobs.timers
    t_setup = time.monotonic()
    await insert_parked(engine, n, status=RunStatus.RETRY_SCHEDULED, partitions=knobs.partitions, wake_in=3600)
    services = Services(infra, partitions=knobs.partitions, lease_ttl=knobs.lease_ttl, log_level=knobs.log_level)
    try:
        services.start("timer", "timer")
        await services.ready()
        await _arm(engine)
        setup_s = time.monotonic() - t_setup
        watch = CpuWatch(groups={"timer": services.pids("timer"), **postgres_and_broker_pids()})
        watch.start()
        watched = time.monotonic()
        committed_p99, all_s = await _until_fired(engine, n, timeout=120, watch=watch)
        cpu = watch.stop()
        watched = time.monotonic() - watched
        async with engine.connect() as conn:
            lateness = [float(x) for x in (await conn.execute(text(
                "SELECT extract(epoch FROM fired_at - wake_at) FROM timers WHERE kind = 'retry_backoff'"))).scalars()]
            woken = (await conn.execute(text(
                "SELECT count(*) FROM run_events WHERE type = 'run.woken' AND applied"))).scalar_one()
        profiled = max(n // 2, 500)
        await insert_parked(engine, profiled, status=RunStatus.RETRY_SCHEDULED, partitions=knobs.partitions,
                            wake_in=3600, prefix="run-profiled")
        sampler = Sampler(services.procs["timer"].pid, infra.logs / "timers-timer.pyspy")
        await _arm(engine)
        sampler.start()
        await _until_fired(engine, n + profiled, timeout=120)
        profile = sampler.stop()
        errors = services.errors()
    finally:
        services.stop()
    return {"timers": n, "timer_replicas": 1, "setup_s": round(setup_s, 1),
            "lateness_s": percentiles(lateness), "p99_until_committed_s": committed_p99,
            "all_fired_after_s": all_s, "fired_per_s": round(n / max(all_s, 1e-3)),
            "runs_woken_once": woken, "cpu_pct": cpu,
            # The timer process's own CPU per timer: unlike lateness, barely moved by other load.
            "timer_cpu_ms_per_timer": round(cpu["timer"] / 100 * watched * 1000 / n, 3),
            # PostgreSQL's over the same window (all its processes: the bench's polling included).
            "postgres_cpu_ms_per_timer": round(cpu.get("postgres", 0.0) / 100 * watched * 1000 / n, 3),
            "profile": {"timer": profile}, "profiled_timers": profiled, "service_errors": errors}


async def _arm(engine: AsyncEngine) -> None:
    """Every run in RETRY_SCHEDULED gets its timer, all due in 2 s, in one statement."""
    async with engine.begin() as conn:
        await conn.execute(text(
            "INSERT INTO timers (timer_key, run_id, kind, wake_at, payload) "
            "SELECT concat_ws(':', run_id, snapshot #>> '{wait,wait_id}', 'wake'), run_id, 'retry_backoff', "
            "       now() + interval '2 seconds', "
            "       jsonb_build_object('wait_id', snapshot #>> '{wait,wait_id}', 'reason', 'timer') "
            "FROM runs WHERE status = 'RETRY_SCHEDULED'"))


async def _until_fired(engine: AsyncEngine, n: int, *, timeout: float,
                       watch: CpuWatch | None = None) -> tuple[float, float]:
    """Seconds (database clock) from the common wake_at until 99% / all of them were visibly fired."""
    p99: float | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        async with engine.connect() as conn:
            fired, since = (await conn.execute(text(
                "SELECT count(fired_at), extract(epoch FROM now() - min(wake_at)) FROM timers "
                "WHERE kind = 'retry_backoff'"))).one()
        if watch is not None:
            watch.sample()
        if p99 is None and fired >= 0.99 * n:
            p99 = round(max(float(since), 0.0), 2)
        if fired >= n:
            return p99 or 0.0, round(max(float(since), 0.0), 2)
        await asyncio.sleep(0.1)
    raise RuntimeError(f"not all {n} timers fired within {timeout}s")


async def waiting_is_free(infra: Infra, engine: AsyncEngine, knobs: Knobs) -> dict[str, Any]:
    """Every service up; watch it idle with 0 parked runs, then with N parked in WAITING_EVENT."""
    await infra.reset(engine)
    services = Services(infra, partitions=knobs.partitions, lease_ttl=knobs.lease_ttl, log_level=knobs.log_level)
    try:
        services.start("scheduler", "scheduler")
        services.start("relay", "relay")
        services.start("timer", "timer")
        if reconciler_present():
            services.start("reconciler", "reconciler")
        services.start("worker-0", "worker")
        await services.ready()
        await services.partitions_owned(engine, "worker")
        await asyncio.sleep(2)  # past start-up
        window = knobs.idle_seconds
        empty = await watch_idle(services, window)
        t0 = time.monotonic()
        await insert_parked(engine, knobs.parked, status=RunStatus.WAITING_EVENT, partitions=knobs.partitions)
        insert_s = time.monotonic() - t0
        await asyncio.sleep(1)
        parked = await watch_idle(services, window)
        async with engine.connect() as conn:
            still = (await conn.execute(text(
                "SELECT count(*) FROM runs WHERE status = 'WAITING_EVENT'"))).scalar_one()
        errors = services.errors()
    finally:
        services.stop()
    worker_growth = parked["rss_kib"]["worker-0"]["after"] - empty["rss_kib"]["worker-0"]["before"]
    return {"parked": knobs.parked, "still_parked": still, "window_s": window, "insert_s": round(insert_s, 1),
            "no_runs": empty, "with_parked": parked,
            "worker_rss_growth_kib": worker_growth,
            "worker_cpu_pct_no_runs": empty["cpu_pct"]["worker-0"],
            "worker_cpu_pct_parked": parked["cpu_pct"]["worker-0"],
            "services_cpu_pct_no_runs": round(sum(v for k, v in empty["cpu_pct"].items()
                                                  if k not in ("postgres", "rabbitmq", "machine")), 1),
            "services_cpu_pct_parked": round(sum(v for k, v in parked["cpu_pct"].items()
                                                 if k not in ("postgres", "rabbitmq", "machine")), 1),
            "service_errors": errors}


async def watch_idle(services: Services, seconds: float) -> dict[str, Any]:
    names = [n for n, p in services.procs.items() if p.alive()]
    before = {n: rss_kib(services.procs[n].pid) or 0 for n in names}
    watch = CpuWatch(groups={**{n: [services.procs[n].pid] for n in names}, **postgres_and_broker_pids()})
    watch.start()
    await asyncio.sleep(seconds)
    cpu = watch.stop()
    after = {n: rss_kib(services.procs[n].pid) or 0 for n in names}
    return {"rss_kib": {n: {"before": before[n], "after": after[n]} for n in names}, "cpu_pct": cpu}
