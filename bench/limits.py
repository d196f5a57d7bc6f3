"""The machine's limits, measured now: PostgreSQL, RabbitMQ, and the bare loop in Python.

- PostgreSQL: ``pgbench`` (a C client, so the database is what is measured) runs one
  step-shaped transaction against the real tables: update a run row by key with a
  revision guard (rewriting its JSONB snapshot, as ``runs.append`` does), insert a run
  event, insert an outbox row (whose NOTIFY trigger fires), at 16 and 64 clients. The
  same transaction from Python (psycopg 3, async, 16 connections) shows the client's cost.
- RabbitMQ: confirmed publish of a ``run.wakeup``-sized message to a quorum queue, awaiting
  each confirm and with 100 in flight; consume + ack at prefetch 1 and 100.
- The bare loop (``bench.bareloop``): consume -> one transaction (inbox, run update, event,
  outbox) -> confirmed publish -> ack, with no framework, in 1 and then 2 processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aio_pika
import psycopg
from sqlalchemy import text

from bench.common import CpuWatch, Proc, ROOT, bottleneck, postgres_and_broker_pids
from bench.infra import Infra
from longrun.bus.codec import to_message
from longrun.db import runs
from longrun.domain import PinnedVersions, RunStatus, Usage, fold, freeze
from longrun.domain import events as ev
from longrun.envelope import make

LIMIT_QUEUE = "bench.limits"
BENCH_RUNS = 10_000

STEP_SQL = """\
\\set r random(1, {runs})
BEGIN;
UPDATE runs SET revision = revision + 1, last_seq = last_seq + 1, updated_at = now(),
       snapshot = jsonb_set(snapshot, '{{revision}}', to_jsonb(revision + 1))
 WHERE run_id = 'bench-' || :r AND revision >= 0 RETURNING last_seq AS seq \\gset
INSERT INTO run_events (run_id, seq, event_id, type, data, applied, fencing_token, occurred_at)
 VALUES ('bench-' || :r, :seq, 'bench-' || :r || ':' || :seq, 'action.confirmed',
         '{event}', true, 1, now());
INSERT INTO outbox (event_id, aggregate_type, aggregate_id, partition, exchange, routing_key, type, payload)
 VALUES (gen_random_uuid()::text, 'run', 'bench-' || :r, 0, 'longrun.events', 'run.status.running',
         'run.event', '{payload}');
END;
"""

EVENT_DATA = json.dumps({"type": "action.confirmed", "seq": 5, "at": 1.0, "logical_action": "step:1",
                         "external_id": None, "receipt_ref": None})


def wakeup_message(run_id: str = "run-00000000-0000-0000-0000-000000000000") -> aio_pika.Message:
    """A message the size the services send (a run.wakeup envelope with its CloudEvents headers)."""
    return to_message(make("run.wakeup", {"wakeup_id": "00000000-0000-0000-0000-000000000000",
                                          "reason": "admitted"},
                           producer="scheduler", tenant_id="bench", run_id=run_id, expected_state_version=3))


def template_run(run_id: str) -> dict[str, Any]:
    """A RUNNING ``steps`` run's row, folded from its events like the store writes it."""
    at = time.time()
    history = [
        ev.RunCreated(seq=1, at=at, run_id=run_id, tenant_id="bench", kind="steps", goal=freeze({"steps": 3}),
                      versions=PinnedVersions(workflow="1", prompt="none", model_policy="none",
                                              tool_schemas="bench-v1"),
                      budget=Usage(model_calls=50, tool_calls=200, cost=10.0)),
        ev.RunStatusChanged(seq=2, at=at, to=RunStatus.RUNNING, reason="bench"),
    ]
    return runs.projection(fold(history))


async def seed_runs(infra: Infra, n: int = BENCH_RUNS) -> None:
    """``bench-1`` .. ``bench-n``: real rows (constraints, indexes, snapshot) for the limit loops."""
    row = template_run("bench-0")
    engine = infra.engine(1)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(
                "INSERT INTO runs (run_id, tenant_id, idempotency_key, input_hash, workflow, workflow_version, "
                " prompt_version, model_policy_version, tool_schema_version, status, revision, last_seq, priority, "
                " partition, budget, snapshot) "
                "SELECT 'bench-' || g, 'bench', 'bench-' || g, 'h', 'steps', '1', 'none', 'none', 'bench-v1', "
                " 'RUNNING', 2, 2, 5, g % 8, CAST(:budget AS jsonb), CAST(:snapshot AS jsonb) "
                "FROM generate_series(1, :n) g"),
                {"budget": json.dumps(row["budget"]), "snapshot": json.dumps(row["snapshot"]), "n": n})
    finally:
        await engine.dispose()


def _pgbench(infra: Infra, clients: int, seconds: float, workdir: Path) -> dict[str, Any]:
    payload = json.loads(wakeup_message().body)
    script = workdir / "step.sql"
    script.write_text(STEP_SQL.format(runs=BENCH_RUNS, event=EVENT_DATA, payload=json.dumps(payload)))
    argv = ["pgbench", "-n", "-M", "prepared", "-f", str(script), "-c", str(clients), "-j", "2",
            "-T", str(max(1, int(seconds))), infra.libpq_url]
    watch = CpuWatch(groups=postgres_and_broker_pids())
    watch.start()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    cpu = watch.stop()
    match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"pgbench failed ({done.returncode}): {done.stderr[-800:]}")
    latency = re.search(r"latency average = ([0-9.]+) ms", done.stdout)
    return {"clients": clients, "txn_per_s": round(float(match.group(1))),
            "latency_ms": float(latency.group(1)) if latency else None, "cpu_pct": cpu}


async def _python_txns(infra: Infra, clients: int, seconds: float) -> dict[str, Any]:
    """The same transaction from asyncio + psycopg 3 (what a Python service can drive)."""
    payload = json.dumps(json.loads(wakeup_message().body))
    conns = [await psycopg.AsyncConnection.connect(infra.libpq_url) for _ in range(clients)]
    done = 0
    stop_at = time.monotonic() + seconds

    async def client(conn: psycopg.AsyncConnection[Any], k: int) -> None:
        nonlocal done
        i = k
        while time.monotonic() < stop_at:
            run_id = f"bench-{1 + (i * 7919) % BENCH_RUNS}"
            i += clients
            if time.monotonic() >= stop_at:
                break
            async with conn.transaction():
                cur = await conn.execute(
                    "UPDATE runs SET revision = revision + 1, last_seq = last_seq + 1, updated_at = now(), "
                    "snapshot = jsonb_set(snapshot, '{revision}', to_jsonb(revision + 1)) "
                    "WHERE run_id = %s AND revision >= 0 RETURNING last_seq", (run_id,))
                row = await cur.fetchone()
                assert row is not None
                seq = row[0]
                await conn.execute(
                    "INSERT INTO run_events (run_id, seq, event_id, type, data, applied, fencing_token, occurred_at) "
                    "VALUES (%s, %s, %s, 'action.confirmed', %s, true, 1, now())",
                    (run_id, seq, f"{run_id}:{seq}", EVENT_DATA))
                await conn.execute(
                    "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, partition, exchange, routing_key, "
                    "type, payload) VALUES (gen_random_uuid()::text, 'run', %s, 0, 'longrun.events', "
                    "'run.status.running', 'run.event', %s)", (run_id, payload))
            if time.monotonic() <= stop_at:
                done += 1

    watch = CpuWatch(groups={"bench": [os.getpid()], **postgres_and_broker_pids()})
    watch.start()
    started = time.monotonic()
    tasks = [asyncio.create_task(client(c, k)) for k, c in enumerate(conns)]
    # Count what completed within the window; a straggler (a lock wait, a stalled backend) is
    # cut off rather than stretching the window.
    _, late = await asyncio.wait(tasks, timeout=seconds + 5)
    for task in late:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    cpu = watch.stop()
    for c in conns:
        try:
            await c.close()
        except Exception:
            pass
    elapsed = min(time.monotonic(), stop_at) - started
    return {"clients": clients, "txn_per_s": round(done / max(elapsed, 1e-3)), "stragglers_cut": len(late),
            "cpu_pct": cpu}


async def postgres(infra: Infra, *, clients: tuple[int, ...], seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        pgbench = [_pgbench(infra, c, seconds, Path(tmp)) for c in clients]
    python = await _python_txns(infra, 16, seconds)
    return {"pgbench": pgbench, "python_psycopg": python,
            "best_txn_per_s": max(r["txn_per_s"] for r in pgbench)}


async def rabbitmq(infra: Infra, *, seconds: float) -> dict[str, Any]:
    message = wakeup_message()
    size = len(message.body)
    connection = await aio_pika.connect(infra.amqp_url)
    out: dict[str, Any] = {"message_bytes": size, "queue": "quorum"}
    watch = CpuWatch(groups={"bench": [os.getpid()], **postgres_and_broker_pids()})
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(LIMIT_QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        await queue.purge()
        exchange = channel.default_exchange

        def fresh() -> aio_pika.Message:
            return aio_pika.Message(body=message.body, headers=message.headers,
                                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                    content_type="application/json")

        # Confirmed publish, awaiting each confirm alone.
        watch.start()
        n, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            await exchange.publish(fresh(), routing_key=LIMIT_QUEUE)
            n += 1
        out["publish_confirm_each_per_s"] = round(n / (time.monotonic() - t0))
        out["publish_confirm_each_cpu_pct"] = watch.stop()

        # Confirmed publish, 100 in flight.
        window = asyncio.Semaphore(100)
        pending: set[asyncio.Task[Any]] = set()
        published = 0

        async def one() -> None:
            nonlocal published
            try:
                await exchange.publish(fresh(), routing_key=LIMIT_QUEUE)
                published += 1
            finally:
                window.release()

        watch.start()
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            await window.acquire()
            task = asyncio.create_task(one())
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)
        out["publish_confirm_100_inflight_per_s"] = round(published / (time.monotonic() - t0))
        out["publish_confirm_100_inflight_cpu_pct"] = watch.stop()
        await channel.close()

        for prefetch in (1, 100):
            out[f"consume_ack_prefetch_{prefetch}_per_s"] = await _consume(connection, prefetch, seconds)
        channel = await connection.channel()
        await channel.queue_delete(LIMIT_QUEUE)
    return out


async def _consume(connection: aio_pika.abc.AbstractConnection, prefetch: int, seconds: float) -> int:
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=prefetch)
    queue = await channel.get_queue(LIMIT_QUEUE)
    got = 0
    last = time.monotonic()
    t0 = time.monotonic()
    finished = asyncio.Event()

    async def on_message(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
        nonlocal got, last
        await msg.ack()
        got += 1
        last = time.monotonic()
        if last - t0 >= seconds:
            finished.set()

    tag = await queue.consume(on_message)
    try:
        while not finished.is_set() and time.monotonic() - t0 < seconds + 1:
            await asyncio.sleep(0.05)
            if got and time.monotonic() - last > 0.5:
                break  # drained
    finally:
        await queue.cancel(tag)
        await channel.close()
    return round(got / max(last - t0, 1e-6))


async def bare_loop(infra: Infra, *, processes: int, inflight: int, seconds: float) -> dict[str, Any]:
    """Start ``processes`` bare-loop processes (each its own queue and runs) and add up their steps."""
    procs: list[tuple[Proc, Path]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(processes):
            result = Path(tmp) / f"loop-{i}.json"
            argv = [sys.executable, "-m", "bench.bareloop", "--index", str(i), "--inflight", str(inflight),
                    "--seconds", str(seconds), "--runs", str(BENCH_RUNS // processes),
                    "--offset", str(1 + i * (BENCH_RUNS // processes)), "--out", str(result)]
            env = {**os.environ, "BENCH_DB": infra.libpq_url, "BENCH_AMQP": infra.amqp_url,
                   "PYTHONPATH": str(ROOT)}
            procs.append((Proc(f"bareloop-{processes}-{i}", argv, env=env,
                               log=infra.logs / f"bareloop-{processes}-{i}.log"), result))
        watch = CpuWatch(groups={**{f"loop:{p.pid}": [p.pid] for p, _ in procs}, **postgres_and_broker_pids()})
        watch.start()
        deadline = time.monotonic() + seconds + 90
        while any(p.alive() for p, _ in procs) and time.monotonic() < deadline:
            watch.sample()
            await asyncio.sleep(0.25)
        cpu = watch.stop()
        results = []
        for proc, path in procs:
            if not path.exists():
                raise RuntimeError(f"{proc.name} wrote no result: {proc.tail()}")
            results.append(json.loads(path.read_text()))
            proc.terminate()
    steps = sum(r["steps_per_s"] for r in results)
    cpu_ms = sum(r["process_cpu_pct"] / 100 for r in results) / max(steps, 1e-6) * 1000
    return {"processes": processes, "steps_per_s": round(steps), "per_process": results, "cpu_pct": cpu,
            "cpu_ms_per_step": round(cpu_ms, 2),
            "bottleneck": bottleneck(cpu)}
