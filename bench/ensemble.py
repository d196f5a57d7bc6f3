"""The ensemble, end to end: real service processes on the ``steps`` workload.

A producer publishes ``run.create`` (workflow ``steps``, input ``{"steps": K}``) on the
ingress exchange with confirms, exactly as any AMQP client would; the scheduler
creates and admits (tenant slots = N, so N runs are in flight), the relay publishes the
wakeups, workers advance each run through its K tool steps. Timings come from
PostgreSQL: ``run_events.recorded_at`` of the first step (``STEP_EVENTS``)
and of ``run.completed``, against the producer's publish time. SQL round trips are
counted inside each service (``bench.counting``), transactions also from
``pg_stat_database``, messages from the outbox and the inbox tables.

Measurements:
- ``lone``: one run at a time (K steps), latency publish -> completed;
- ``bus``: one run at a time again, latency publish -> its terminal event delivered to a consumer on
  the bus (``bench.terminal_event``);
- ``saturate``: M runs published at once, N in flight: sustained steps/s and runs/s
  (between the 10th and 90th percentile of step completions), latency percentiles,
  transactions, round trips and messages per step, CPU per process, the bottleneck;
- ``half_load``: runs published at a steady rate of half the sustained runs/s, open loop:
  latency to the first step and to completion.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from bench import terminal_event
from bench.common import CpuWatch, Knobs, bottleneck, percentiles, postgres_and_broker_pids
from bench.infra import Infra, Services, pg_xacts, pruned_so_far
from bench.profile import Sampler
from longrun.bus import topology
from longrun.bus.codec import broker_user, to_message
from longrun.envelope import make
from longrun_client.retry import Backoff, publish_confirmed

TENANT = "bench"
NACK_BACKOFF = Backoff(give_up_after=60.0)
STEP_EVENTS = "('action.confirmed', 'action.recorded')"
"""A confirmed step: a write's confirmation, or a pure or read call recorded with its answer."""


def reconciler_present() -> bool:
    try:
        return importlib.util.find_spec("longrun.services.reconciler.main") is not None
    except ModuleNotFoundError:
        return False


def create_message(key: str, steps: int, *, user: str, workflow: str = "steps") -> aio_pika.Message:
    """The run.create the bench's producer sends for the run of idempotency key ``key``."""
    return to_message(make("run.create", {"workflow": workflow, "idempotency_key": key, "input": {"steps": steps},
                                          "priority": 5}, producer="bench", tenant_id=TENANT), user_id=user)


class Producer:
    """An external AMQP producer of run.create, with publisher confirms (pipelined); a nacked create
    (the ingress queue at its bound) is sent again unchanged with backoff, as longrun_client does."""

    def __init__(self, amqp_url: str) -> None:
        self.amqp_url = amqp_url
        self.connection: aio_pika.abc.AbstractRobustConnection | aio_pika.abc.AbstractConnection | None = None
        self.exchange: aio_pika.abc.AbstractExchange | None = None
        self.published: dict[str, float] = {}

    async def __aenter__(self) -> Producer:
        self.connection = await aio_pika.connect(self.amqp_url)
        channel = await self.connection.channel(publisher_confirms=True)
        self.exchange = await channel.get_exchange(topology.INGRESS_EXCHANGE)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self.connection is not None:
            await self.connection.close()

    async def create(self, key: str, steps: int, workflow: str = "steps") -> None:
        assert self.exchange is not None
        message = create_message(key, steps, user=broker_user(self.amqp_url), workflow=workflow)
        self.published[key] = time.time()
        exchange = self.exchange
        await publish_confirmed(lambda: exchange.publish(message, routing_key="run.create"),
                                exchange=topology.INGRESS_EXCHANGE, routing_key="run.create", backoff=NACK_BACKOFF,
                                what=f"run.create {key}")

    async def burst(self, keys: list[str], steps: int, window: int = 100, workflow: str = "steps") -> None:
        slots = asyncio.Semaphore(window)

        async def one(key: str) -> None:
            async with slots:
                await self.create(key, steps, workflow)

        await asyncio.gather(*(one(k) for k in keys))

    async def paced(self, prefix: str, steps: int, *, rate: float, seconds: float) -> list[str]:
        """Open loop: one run.create every 1/rate s for ``seconds`` (confirms awaited off the beat)."""
        keys: list[str] = []
        tasks = []
        t0 = time.monotonic()
        i = 0
        while True:
            due = t0 + i / rate
            if due - t0 > seconds:
                break
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            key = f"{prefix}-{i:06d}"
            keys.append(key)
            tasks.append(asyncio.create_task(self.create(key, steps)))
            i += 1
        await asyncio.gather(*tasks)
        return keys


PROFILED = ("worker-0", "scheduler", "relay")


@dataclass
class Ensemble:
    infra: Infra
    engine: AsyncEngine
    knobs: Knobs
    workers: int
    services: Services | None = None
    tenant_slots: int | None = None
    run_kinds: str | None = None
    """``LONGRUN_RUN_KINDS`` of its services; None: the default (``steps``)."""
    env: dict[str, str] | None = None
    """More ``LONGRUN_*`` variables for its services (they win over ``BENCH_RETENTION``'s)."""
    timeline_dir: Path | None = None
    """Its services mark a lone create's way there (``bench.timeline``) and count no SQL."""

    async def start(self, *, count: bool = True, lease_ttl: float | None = None,
                    reconciler: bool = False, **env: str) -> Services:
        """scheduler, relay, timer, the reconciler and W workers: every service a deployment runs
        but the gateway (nothing here calls it); ``env``: settings of every service that differ from
        the bench's (``bench.infra.Services.env``). BENCH_RECONCILER=0 leaves the reconciler out
        (about 1 % of the machine in a saturated ensemble: its sweeps each second, a drift walk a
        minute, which skips the pure steps' tool because it has no far side to look up)."""
        reconciler = reconciler or os.environ.get("BENCH_RECONCILER", "1") != "0"
        await self.infra.reset(self.engine)
        count_dir = self.infra.logs / f"counts-{uuid.uuid4().hex[:6]}" if count else None
        if count_dir is not None:
            count_dir.mkdir(parents=True)
        services = Services(self.infra, partitions=self.knobs.partitions,
                            lease_ttl=lease_ttl or self.knobs.lease_ttl, log_level=self.knobs.log_level,
                            count_dir=count_dir, timeline_dir=self.timeline_dir,
                            LONGRUN_TENANT_SLOTS=str(self.tenant_slots or self.knobs.inflight),
                            LONGRUN_WORKER_CONCURRENCY=str(self.knobs.worker_concurrency),
                            **({"LONGRUN_RUN_KINDS": self.run_kinds} if self.run_kinds else {}), **(self.env or {}),
                            **env)
        self.services = services
        services.start("scheduler", "scheduler")
        services.start("relay", "relay")
        services.start("timer", "timer")
        if reconciler and reconciler_present():
            services.start("reconciler", "reconciler")
        for i in range(self.workers):
            services.start(f"worker-{i}", "worker")
        await services.ready()
        await services.partitions_owned(self.engine, "worker")
        await services.partitions_owned(self.engine, "outbox-relay")
        await asyncio.sleep(1.0)  # let the replicas' first rebalance rounds settle
        return services

    def stop(self) -> None:
        if self.services is not None:
            self.services.stop()

    def cpu_groups(self) -> dict[str, Any]:
        assert self.services is not None
        groups: dict[str, Any] = {name: [p.pid] for name, p in self.services.procs.items()}
        return {**groups, **postgres_and_broker_pids()}

    # -- measurements ---------------------------------------------------------------------------

    async def lone(self, n: int, published: dict[str, float] | None = None) -> dict[str, Any]:
        """One run at a time: publish -> completed, and publish -> first step. ``published``: given
        each run's publish time (wall clock) by its idempotency key."""
        prefix = f"lone-{uuid.uuid4().hex[:6]}"
        async with Producer(self.infra.amqp_url) as producer:
            for i in range(n):
                key = f"{prefix}-{i:04d}"
                await producer.create(key, self.knobs.steps)
                await self._wait_completed(prefix, i + 1, timeout=30)
            timings = await self._timings(prefix, producer.published)
            hops = await self._hops(prefix, producer.published, timings)
        if published is not None:
            published.update(producer.published)
        done = [t["completed_ms"] for t in timings if t["completed_ms"] is not None]
        first = [t["first_step_ms"] for t in timings if t["first_step_ms"] is not None]
        # The first run warms every pool and prepared statement: report the rest.
        return {"runs": n, "steps_per_run": self.knobs.steps,
                "completed_ms": percentiles(done[1:] or done), "first_step_ms": percentiles(first[1:] or first),
                "hops_p50_ms": hops}

    async def saturate(self, runs: int, workflow: str = "steps") -> dict[str, Any]:
        """M runs at once, N in flight; the sustained rates and what each step cost. ``workflow``: ``steps``
        or its code-first twin ``steps_code_first``."""
        assert self.services is not None
        prefix = f"sat-{uuid.uuid4().hex[:6]}"
        keys = [f"{prefix}-{i:06d}" for i in range(runs)]
        before_rows = await self._db_counts()
        before_sql = await self.services.snapshot_counts()
        before_x = await pg_xacts(self.engine)
        watch = CpuWatch(groups=self.cpu_groups())
        watch.start()
        t0 = time.time()
        async with Producer(self.infra.amqp_url) as producer:
            await producer.burst(keys, self.knobs.steps, workflow=workflow)
            publish_s = time.time() - t0
            await self._wait_completed(prefix, runs, timeout=max(120.0, runs * self.knobs.steps / 10),
                                       watch=watch)
        makespan = time.time() - t0
        cpu = watch.stop()
        after_sql = await self.services.snapshot_counts()
        after_x = await pg_xacts(self.engine)
        after_rows = await self._db_counts()
        timings = await self._timings(prefix, producer.published)
        step_times = await self._step_times(prefix)
        steps = len(step_times)
        rows = {k: after_rows[k] - before_rows[k] for k in after_rows}
        sql = _sql_delta(before_sql, after_sql)
        sustained = _sustained(step_times)
        completed = sorted(t["completed_at"] for t in timings if t["completed_at"] is not None)
        cpu["workers"] = round(sum(v for k, v in cpu.items() if k.startswith("worker-")), 1)
        services_cpu = sum(v for k, v in cpu.items() if k not in ("postgres", "rabbitmq", "machine", "workers"))
        cpu["outside_bench"] = round(max(cpu["machine"] - services_cpu - cpu["postgres"] - cpu["rabbitmq"], 0.0), 1)
        ms = makespan * 1000 / max(len(step_times), 1) / 100  # CPU% x makespan -> CPU ms per step
        cpu_ms = {"workers": round(cpu["workers"] * ms, 2), "all services": round(services_cpu * ms, 2),
                  "postgres": round(cpu["postgres"] * ms, 2), "rabbitmq": round(cpu["rabbitmq"] * ms, 2)}
        result = {
            "runs": runs, "steps_per_run": self.knobs.steps, "inflight": self.tenant_slots or self.knobs.inflight,
            "workers": self.workers, "steps": steps, "publish_s": round(publish_s, 2),
            "makespan_s": round(makespan, 2),
            "steps_per_s": round(sustained, 1),
            "steps_per_s_overall": round(steps / makespan, 1),
            "runs_per_s": round(_sustained(completed), 1),
            "first_step_ms": percentiles([t["first_step_ms"] for t in timings if t["first_step_ms"] is not None]),
            "completed_ms": percentiles([t["completed_ms"] for t in timings if t["completed_ms"] is not None]),
            "per_step": _per_step(rows, sql, after_x, before_x, steps, runs),
            "sql_by_service": {name: _per(v, steps) for name, v in sql.items()},
            "cpu_pct": cpu,
            "cpu_ms_per_step": cpu_ms,
            "bottleneck": bottleneck({k: v for k, v in cpu.items() if k not in ("workers", "outside_bench")},
                                     outside=cpu["outside_bench"]),
        }
        return result

    async def profiled(self, runs: int) -> dict[str, Any]:
        """A smaller saturation with py-spy sampling a worker, the scheduler and the relay: where
        their CPU goes (apart from ``saturate``, so that the samplers' CPU does not touch its figures)."""
        assert self.services is not None
        prefix = f"prof-{uuid.uuid4().hex[:6]}"
        samplers = {name: Sampler(self.services.procs[name].pid, self.infra.logs / f"{prefix}-{name}.pyspy")
                    for name in PROFILED if name in self.services.procs}
        for sampler in samplers.values():
            sampler.start()
        async with Producer(self.infra.amqp_url) as producer:
            await producer.burst([f"{prefix}-{i:06d}" for i in range(runs)], self.knobs.steps)
            await self._wait_completed(prefix, runs, timeout=max(120.0, runs * self.knobs.steps / 10))
        return {"runs": runs, **{name: sampler.stop() for name, sampler in samplers.items()}}

    async def half_load(self, runs_per_s: float, seconds: float) -> dict[str, Any]:
        prefix = f"half-{uuid.uuid4().hex[:6]}"
        rate = max(runs_per_s / 2, 1.0)
        watch = CpuWatch(groups=self.cpu_groups())
        watch.start()
        async with Producer(self.infra.amqp_url) as producer:
            keys = await producer.paced(prefix, self.knobs.steps, rate=rate, seconds=seconds)
            await self._wait_completed(prefix, len(keys), timeout=60, watch=watch)
            timings = await self._timings(prefix, producer.published)
        return {"rate_runs_per_s": round(rate, 1), "rate_steps_per_s": round(rate * self.knobs.steps, 1),
                "runs": len(keys), "seconds": seconds,
                "first_step_ms": percentiles([t["first_step_ms"] for t in timings if t["first_step_ms"] is not None]),
                "completed_ms": percentiles([t["completed_ms"] for t in timings if t["completed_ms"] is not None]),
                "cpu_pct": watch.stop()}

    # -- reading PostgreSQL ---------------------------------------------------------------------

    async def _wait_completed(self, prefix: str, n: int, *, timeout: float, watch: CpuWatch | None = None) -> None:
        deadline = time.monotonic() + timeout
        last, last_change = -1, time.monotonic()
        while True:
            async with self.engine.connect() as conn:
                done = (await conn.execute(text(
                    "SELECT count(*) FROM runs WHERE tenant_id = :t AND idempotency_key LIKE :p "
                    "AND status = 'COMPLETED'"), {"t": TENANT, "p": prefix + "%"})).scalar_one()
            if done >= n:
                return
            if watch is not None:
                watch.sample()
            if done != last:
                last, last_change = done, time.monotonic()
            if time.monotonic() > deadline or time.monotonic() - last_change > 30:
                statuses = await self._statuses(prefix)
                raise RuntimeError(f"{done}/{n} runs completed ({prefix}); statuses {statuses}; "
                                   f"service errors: {self.services.errors() if self.services else {}}")
            await asyncio.sleep(0.005 if n == 1 or n - done <= 1 else 0.1)

    async def _statuses(self, prefix: str) -> dict[str, int]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(text(
                "SELECT status, count(*) FROM runs WHERE idempotency_key LIKE :p GROUP BY status"),
                {"p": prefix + "%"})
            return {r[0]: r[1] for r in rows}

    async def _timings(self, prefix: str, published: dict[str, float]) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT r.idempotency_key AS key, "
                f" extract(epoch FROM min(e.recorded_at) FILTER (WHERE e.type IN {STEP_EVENTS})) AS first_step, "
                " extract(epoch FROM max(e.recorded_at) FILTER (WHERE e.type = 'run.completed')) AS completed "
                "FROM runs r JOIN run_events e ON e.run_id = r.run_id "
                "WHERE r.tenant_id = :t AND r.idempotency_key LIKE :p GROUP BY r.idempotency_key"),
                {"t": TENANT, "p": prefix + "%"})).all()
        out = []
        for row in rows:
            t_pub = published.get(row.key)
            if t_pub is None:
                continue
            first = float(row.first_step) if row.first_step is not None else None
            done = float(row.completed) if row.completed is not None else None
            out.append({"key": row.key, "first_step_ms": None if first is None else (first - t_pub) * 1000,
                        "completed_ms": None if done is None else (done - t_pub) * 1000, "completed_at": done})
        return out

    async def _hops(self, prefix: str, published: dict[str, float],
                    timings: list[dict[str, Any]]) -> dict[str, float]:
        """Where a lone run's time goes, hop by hop (p50 over the runs but the first; each
        timestamp is the start of the transaction that wrote it). ``timings`` (``_timings``)
        gives the first step and the completion; this reads the marks before them."""
        async with self.engine.connect() as conn:
            rows = {row.key: row for row in (await conn.execute(text(
                "SELECT r.idempotency_key AS key, "
                " extract(epoch FROM min(e.recorded_at) FILTER (WHERE e.type = 'run.created')) AS created, "
                " (SELECT extract(epoch FROM min(o.created_at)) FROM outbox o "
                "   WHERE o.aggregate_id = r.run_id AND o.type = 'run.wakeup') AS admitted, "
                # The take writes no event (the move to RUNNING commits with the first step): its
                # mark is the worker's inbox row for the wakeup, written by the take's statement.
                " (SELECT extract(epoch FROM min(i.handled_at)) FROM inbox_worker i "
                "   WHERE i.run_id = r.run_id AND i.message_type = 'run.wakeup') AS taken "
                "FROM runs r JOIN run_events e ON e.run_id = r.run_id "
                "WHERE r.tenant_id = :t AND r.idempotency_key LIKE :p GROUP BY r.idempotency_key, r.run_id"),
                {"t": TENANT, "p": prefix + "%"})).all()}
        names = ("broker + scheduler create", "admission", "relay + broker + worker take", "first step",
                 "the other steps + finish")
        spans: dict[str, list[float]] = {name: [] for name in names}
        for timing in sorted(timings, key=lambda t: t["key"])[1:]:
            row, t_pub = rows.get(timing["key"]), published[timing["key"]]
            if row is None or None in (row.created, row.admitted, row.taken) or timing["completed_ms"] is None:
                continue
            # Every mark in ms after run.create was published, in the order the run passes them.
            at = [0.0, *((float(m) - t_pub) * 1000 for m in (row.created, row.admitted, row.taken)),
                  timing["first_step_ms"], timing["completed_ms"]]
            for name, (a, b) in zip(names, zip(at, at[1:], strict=False), strict=True):
                spans[name].append(b - a)
        return {name: round(statistics.median(v), 1) for name, v in spans.items() if v}

    async def _step_times(self, prefix: str) -> list[float]:
        async with self.engine.connect() as conn:
            return sorted(float(x) for x in (await conn.execute(text(
                "SELECT extract(epoch FROM e.recorded_at) FROM run_events e JOIN runs r ON r.run_id = e.run_id "
                f"WHERE r.tenant_id = :t AND r.idempotency_key LIKE :p AND e.type IN {STEP_EVENTS}"),
                {"t": TENANT, "p": prefix + "%"})).scalars())

    async def _db_counts(self) -> dict[str, int]:
        async with self.engine.connect() as conn:
            row = (await conn.execute(text(
                "SELECT (SELECT count(*) FROM outbox WHERE published_at IS NOT NULL) AS published, "
                "       (SELECT count(*) FROM outbox) AS outbox, "
                "       (SELECT count(*) FROM inbox_scheduler) AS consumed_scheduler, "
                "       (SELECT count(*) FROM inbox_worker) AS consumed_worker, "
                "       (SELECT count(*) FROM run_events) AS events"))).one()
        return dict(row._mapping)


def _sustained(times: list[float]) -> float:
    """Rate between the 10th and 90th percentile of completions (ramp-up and tail left out)."""
    if len(times) < 10:
        return len(times) / max(times[-1] - times[0], 1e-3) if len(times) > 1 else 0.0
    lo, hi = int(len(times) * 0.1), int(len(times) * 0.9)
    span = times[hi] - times[lo]
    return (hi - lo) / span if span > 0 else 0.0


def _sql_delta(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name, counts in after.items():
        base = before.get(name, {})
        out[name] = {k: v - base.get(k, 0) for k, v in counts.items()}
    total: dict[str, int] = {}
    for counts in out.values():
        for k, v in counts.items():
            total[k] = total.get(k, 0) + v
    out["all services"] = total
    return out


def _per(counts: dict[str, int], steps: int) -> dict[str, float]:
    s = max(steps, 1)
    tx = counts.get("commit", 0) + counts.get("rollback", 0)
    return {"statements": round(counts.get("statements", 0) / s, 2), "commits": round(counts.get("commit", 0) / s, 2),
            "read_only_or_rolled_back": round(counts.get("rollback", 0) / s, 2),
            # BEGIN, each statement, COMMIT/ROLLBACK: one network round trip each with psycopg 3
            "round_trips": round((counts.get("statements", 0) + counts.get("begin", 0) + tx) / s, 2)}


def _per_step(rows: dict[str, int], sql: dict[str, dict[str, int]], after_x: tuple[int, int],
              before_x: tuple[int, int], steps: int, runs: int) -> dict[str, Any]:
    s = max(steps, 1)
    published = rows["published"] + runs  # + the producer's run.create messages
    consumed = rows["consumed_scheduler"] + rows["consumed_worker"]
    total = sql.get("all services", {})
    return {
        "pg_xact_commit": round((after_x[0] - before_x[0]) / s, 2),
        "pg_xact_rollback": round((after_x[1] - before_x[1]) / s, 2),
        "service_commits": round(total.get("commit", 0) / s, 2),
        "service_read_only_txns": round(total.get("rollback", 0) / s, 2),
        "service_statements_alone": round(total.get("autocommit_statements", 0) / s, 2),
        "service_statements": round(total.get("statements", 0) / s, 2),
        "service_round_trips": _per(total, steps)["round_trips"] if total else None,
        "messages_published": round(published / s, 2),
        "messages_consumed": round(consumed / s, 2),
        "run_events": round(rows["events"] / s, 2),
        "note": "pg_xact_* include the bench's own polling (read-only) and every service's background work",
    }


async def run_phase(infra: Infra, engine: AsyncEngine, knobs: Knobs, workers: int) -> dict[str, Any]:
    """lone (in PostgreSQL, then on the bus) + saturation + half load on ``workers`` replicas."""
    ensemble = Ensemble(infra, engine, knobs, workers)
    pruned_before = await pruned_so_far(engine)
    try:
        await ensemble.start()
        lone = await ensemble.lone(knobs.lone)
        async with Producer(infra.amqp_url) as producer:
            bus = await terminal_event.lone_runs(producer, TENANT, knobs.lone, knobs.steps)
        saturate = await ensemble.saturate(knobs.runs)
        half = await ensemble.half_load(saturate["runs_per_s"], knobs.half_load_seconds)
        profile = await ensemble.profiled(max(knobs.runs // 2, 100))
        errors = ensemble.services.errors() if ensemble.services else {}
    finally:
        ensemble.stop()
    pruned = {table: n - pruned_before.get(table, 0) for table, n in (await pruned_so_far(engine)).items()}
    return {"workers": workers, "lone": lone, "bus": bus, "saturate": saturate, "half_load": half, "profile": profile,
            "pruned": {table: n for table, n in pruned.items() if n}, "service_errors": errors}


CODE_FIRST_KINDS = "longrun.workflows:builtin,longrun.workflows.steps_code_first:STEPS_CODE_FIRST"


async def code_first_phase(infra: Infra, engine: AsyncEngine, knobs: Knobs, workers: int) -> dict[str, Any]:
    """The ``steps`` workload decide-style and code-first (``steps_code_first``), saturated in turn on one
    ensemble: what replaying a function on every step costs beside ``decide``."""
    ensemble = Ensemble(infra, engine, knobs, workers, run_kinds=CODE_FIRST_KINDS)
    try:
        await ensemble.start()
        decide = await ensemble.saturate(knobs.runs)
        code_first = await ensemble.saturate(knobs.runs, workflow="steps_code_first")
    finally:
        ensemble.stop()
    keep = ("steps_per_s", "steps_per_s_overall", "runs_per_s", "cpu_ms_per_step", "completed_ms")
    return {"decide": {k: decide[k] for k in keep}, "code_first": {k: code_first[k] for k in keep},
            "code_first_vs_decide": round(code_first["steps_per_s"] / max(decide["steps_per_s"], 0.1), 2)}


async def scale_point(infra: Infra, engine: AsyncEngine, knobs: Knobs, workers: int) -> dict[str, Any]:
    ensemble = Ensemble(infra, engine, knobs, workers)
    try:
        await ensemble.start()
        result = await ensemble.saturate(knobs.runs // 2 if knobs.quick else knobs.runs)
        result["service_errors"] = ensemble.services.errors() if ensemble.services else {}
    finally:
        ensemble.stop()
    return result
