"""A million waiting runs (``make bench-scale``, phase ``million``): what parking costs at volume.

Runs are parked half on events (WAITING_EVENT, with their deadline timers) and half on timers
(RETRY_SCHEDULED, their wake a day away), folded from their domain events and written with the rows
the store writes (``bench.timers.insert_parked``). The same figures are taken at each size of
``BENCH_SCALE_RUNS`` (``20000,1000000``), so whether each stays flat is read side by side:

- storage per parked run (runs, their events and timers, with indexes);
- each of the reconciler's sweeps, and the gauge collector's read behind ``/metrics``, run here on
  the bench database as the reconciler runs them, and a scrape of every service's ``/metrics``;
- the whole ensemble's CPU while nothing happens: in the first seconds after it starts, then steady;
- 10,000 of the parked runs woken at once by their timers: the timers' lateness and how long until
  every one fired and every run was taken up again.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.common import CpuWatch, Knobs, percentiles, postgres_and_broker_pids
from bench.infra import Infra, Services
from bench.timers import insert_parked, watch_idle
from longrun import run_kinds
from longrun.artifacts import FilesystemArtifactStore
from longrun.config import Settings
from longrun.domain import RunStatus
from longrun.services.reconciler import alerts, gauges, sweeps, tool_health
from longrun.services.reconciler.sweeps import HEALTH_BATCH, LEASE_BATCH, Sweeper

WOKEN = 10_000
"""Parked runs whose timers come due at the same instant, at each size."""
TABLES = ("runs", "run_events", "timers")
SAMPLES = 3
"""Each sweep is timed this many times; the median is reported."""
STEADY_SECONDS = 45.0
"""The second idle window, right after the first (``BENCH_IDLE_SECONDS``, which holds what every
service does once at start, such as the reconciler's first retention pass): three gauge reads."""


def sizes() -> tuple[int, ...]:
    raw = os.environ.get("BENCH_SCALE_RUNS", "20000,1000000")
    try:
        found = tuple(sorted(int(s) for s in raw.split(",") if s.strip()))
    except ValueError:
        raise SystemExit(f"BENCH_SCALE_RUNS: expected a comma list of run counts, got {raw!r}") from None
    if not found or found[0] < 2 * WOKEN:
        raise SystemExit(f"BENCH_SCALE_RUNS: every size must be at least {2 * WOKEN}, got {raw!r}")
    return found


async def million(infra: Infra, engine: AsyncEngine, knobs: Knobs) -> dict[str, Any]:
    await infra.reset(engine)
    points = []
    loaded = 0
    for size in sizes():
        t0 = time.monotonic()
        half = (size - loaded) // 2
        await insert_parked(engine, half, status=RunStatus.WAITING_EVENT, partitions=knobs.partitions,
                            start=loaded // 2, prefix="run-on-event")
        await insert_parked(engine, size - loaded - half, status=RunStatus.RETRY_SCHEDULED,
                            partitions=knobs.partitions, wake_in=86_400, start=loaded // 2, prefix="run-on-timer")
        await _schedule_wakes(engine)
        load_s = time.monotonic() - t0
        await _settle(infra)
        loaded = size
        point = {"parked": size, "load_s": round(load_s, 1), "storage": await _storage(engine, size),
                 "sweeps_ms": await _sweeps(infra, engine),
                 "idle_cpu_pct_before_services": await _idle_alone(knobs.idle_seconds)}
        point.update(await _ensemble(infra, engine, knobs))
        points.append(point)
        print(f"bench: million: {size} parked measured", flush=True)
    return {"sizes": [p["parked"] for p in points], "points": points, "woken_at_once": WOKEN}


async def _schedule_wakes(engine: AsyncEngine) -> None:
    """Each RETRY_SCHEDULED run's wake timer, as ``ports.runs.wait_timers`` makes it."""
    async with engine.begin() as conn:
        await conn.execute(text(
            "INSERT INTO timers (timer_key, run_id, kind, wake_at, payload) "
            "SELECT concat_ws(':', run_id, snapshot #>> '{wait,wait_id}', 'wake'), run_id, 'retry_backoff', "
            "       to_timestamp((snapshot #>> '{wait,wake_at}')::float8), "
            "       jsonb_build_object('wait_id', snapshot #>> '{wait,wait_id}', 'reason', 'timer') "
            "FROM runs WHERE status = 'RETRY_SCHEDULED' ON CONFLICT (timer_key) DO NOTHING"))


async def _settle(infra: Infra) -> None:
    """The tables as they are once autovacuum has passed after a load this size: fresh statistics and
    visibility maps, every row frozen (no hint bit left for the first reads to set, no page left for an
    anti-wraparound vacuum), and the load's dirty pages written by a checkpoint. Without it, the idle
    window measured PostgreSQL finishing the load (70 % of a core at a million)."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(infra.libpq_url, autocommit=True) as conn:
        for table in TABLES:
            await conn.execute(f"VACUUM (FREEZE, ANALYZE) {table}")
        await conn.execute("CHECKPOINT")


async def _idle_alone(seconds: float) -> dict[str, float]:
    """PostgreSQL's and the broker's CPU with no service running: what the idle ensemble adds is
    read against it."""
    watch = CpuWatch(groups=postgres_and_broker_pids())
    watch.start()
    await asyncio.sleep(seconds)
    return watch.stop()


async def _storage(engine: AsyncEngine, parked: int) -> dict[str, Any]:
    async with engine.connect() as conn:
        sizes_ = {t: int((await conn.execute(text("SELECT pg_total_relation_size(:t)"), {"t": t})).scalar_one())
                  for t in TABLES}
    total = sum(sizes_.values())
    return {"bytes_by_table": sizes_, "total_mib": round(total / 2**20, 1),
            "bytes_per_parked_run": round(total / parked)}


async def _sweeps(infra: Infra, engine: AsyncEngine) -> dict[str, float]:
    """Median milliseconds of each periodic statement the reconciler runs, over the parked runs."""
    settings = Settings.from_env({"LONGRUN_DATABASE_URL": infra.database_url, "LONGRUN_AMQP_URL": infra.amqp_url,
                                  "LONGRUN_ARTIFACT_DIR": str(infra.logs / "artifacts")})
    kinds = run_kinds.load(settings)
    sweeper = Sweeper(engine, kinds, FilesystemArtifactStore(settings.artifact_dir), settings)
    steps: dict[str, Callable[[], Awaitable[object]]] = {
        "reconcile unknown actions": lambda: sweeps.reconcile_unknown(engine, kinds, limit=50, clock=time.time,
                                                                         artifacts=sweeper.artifacts),
        "flag silent runs": lambda: alerts.flag_silent_runs(engine, limits=settings.silence_limits),
        "flag runs without a worker": lambda: alerts.flag_runs_without_worker(engine),
        "wake for tool health": lambda: tool_health.wake_for_health(engine, settings.breaker(), limit=HEALTH_BATCH),
        "drift walk (one batch)": lambda: alerts.check_drift(engine, kinds, limit=20, after=""),
        "rewake expired leases": lambda: sweeps.rewake_expired_leases(engine, limit=LEASE_BATCH),
        "next lease expiry": lambda: sweeps.seconds_until_a_lease_expires(engine),
        "gauges read (behind /metrics)": lambda: gauges.collect_once(
            engine, silence_limits=settings.silence_limits, tenants=settings.metrics_tenant_label),
    }
    out = {}
    for name, step in steps.items():
        took = []
        for _ in range(SAMPLES):
            t0 = time.perf_counter()
            await step()
            took.append((time.perf_counter() - t0) * 1000)
        out[name] = round(statistics.median(took), 1)
    return out


async def _ensemble(infra: Infra, engine: AsyncEngine, knobs: Knobs) -> dict[str, Any]:
    services = Services(infra, partitions=knobs.partitions, lease_ttl=knobs.lease_ttl, log_level=knobs.log_level)
    try:
        for name in ("scheduler", "relay", "timer", "reconciler"):
            services.start(name, name)
        services.start("worker-0", "worker")
        await services.ready()
        await services.partitions_owned(engine, "worker")
        await asyncio.sleep(2)  # past start-up
        idle = await watch_idle(services, knobs.idle_seconds)
        steady = await watch_idle(services, STEADY_SECONDS)
        scrape = await _scrape(services)
        woken = await _wake_at_once(engine)
        errors = services.errors()
    finally:
        services.stop()
    return {"idle_cpu_pct": idle["cpu_pct"], "idle_services_cpu_pct": _services_pct(idle["cpu_pct"]),
            "steady_cpu_pct": steady["cpu_pct"], "steady_services_cpu_pct": _services_pct(steady["cpu_pct"]),
            "scrape_ms": scrape, "wake": woken, "service_errors": errors}


def _services_pct(cpu: dict[str, float]) -> float:
    return round(sum(v for k, v in cpu.items() if k not in ("postgres", "rabbitmq", "machine")), 1)


async def _scrape(services: Services) -> dict[str, float]:
    """Milliseconds of one ``GET /metrics`` per service (median of three)."""
    out = {}
    async with httpx.AsyncClient(timeout=30) as http:
        for name, port in services.ports.items():
            took = []
            for _ in range(SAMPLES):
                t0 = time.perf_counter()
                (await http.get(f"http://127.0.0.1:{port}/metrics")).raise_for_status()
                took.append((time.perf_counter() - t0) * 1000)
            out[name] = round(statistics.median(took), 1)
    return out


async def _wake_at_once(engine: AsyncEngine, timeout: float = 300) -> dict[str, Any]:
    """``WOKEN`` wake timers of runs still parked, all due 2 s from now: seconds (database clock)
    from that instant until every one fired, every one of their runs was taken up (left
    RETRY_SCHEDULED) and every one completed its three steps."""
    async with engine.begin() as conn:
        due = (await conn.execute(text(
            "UPDATE timers SET wake_at = now() + interval '2 seconds' WHERE timer_key IN ("
            "  SELECT t.timer_key FROM timers t JOIN runs r USING (run_id) WHERE t.kind = 'retry_backoff'"
            "  AND t.fired_at IS NULL AND t.cancelled_at IS NULL AND r.status = 'RETRY_SCHEDULED' LIMIT :n) "
            "RETURNING run_id, wake_at"), {"n": WOKEN})).all()
    run_ids = [r.run_id for r in due]
    at = due[0].wake_at
    fired_s = taken_s = completed_s = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and completed_s is None:
        async with engine.connect() as conn:
            fired, parked, completed, since = (await conn.execute(text(
                "SELECT (SELECT count(*) FROM timers WHERE run_id = ANY(:ids) AND kind = 'retry_backoff' "
                "        AND fired_at IS NOT NULL), "
                "       (SELECT count(*) FROM runs WHERE run_id = ANY(:ids) AND status = 'RETRY_SCHEDULED'), "
                "       (SELECT count(*) FROM runs WHERE run_id = ANY(:ids) AND status = 'COMPLETED'), "
                "       extract(epoch FROM now() - :at)"), {"ids": run_ids, "at": at})).one()
        if fired_s is None and fired >= len(run_ids):
            fired_s = round(float(since), 2)
        if taken_s is None and fired >= len(run_ids) and parked == 0:
            taken_s = round(float(since), 2)
        if completed >= len(run_ids):  # the next size's idle figures start from a still ensemble
            completed_s = round(float(since), 2)
        await asyncio.sleep(0.1)
    async with engine.connect() as conn:
        lateness = [float(x) for x in (await conn.execute(text(
            "SELECT extract(epoch FROM fired_at - wake_at) FROM timers WHERE run_id = ANY(:ids) "
            "AND kind = 'retry_backoff' AND fired_at IS NOT NULL"), {"ids": run_ids})).scalars()]
    return {"timers": len(run_ids), "lateness_s": percentiles(lateness), "all_fired_after_s": fired_s,
            "all_taken_up_after_s": taken_s, "all_completed_after_s": completed_s}
