"""The bare loop: the floor cost of this design in Python, with no framework at all.

One process: consume a wakeup-sized message (prefetch 100) -> ONE transaction (inbox
row, run update guarded by the revision the message carries, event, outbox row) ->
confirmed publish of the run's next message -> ack. ``--inflight`` runs circulate, each
always having exactly one message in the queue or in hand, like N runs in flight.
It runs on the services' event loop (uvloop), so the ratio compares code, not loops.
Prints/writes ``{"steps": ..., "steps_per_s": ...}`` measured over ``--seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import aio_pika
import psycopg
import uvloop

from bench.limits import EVENT_DATA, wakeup_message

DB_CONNECTIONS = 16


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    queue_name = f"bench.loop.{args.index}"
    template = json.loads(wakeup_message().body)
    conns: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
    for _ in range(DB_CONNECTIONS):
        conns.put_nowait(await psycopg.AsyncConnection.connect(os.environ["BENCH_DB"]))
    connection = await aio_pika.connect(os.environ["BENCH_AMQP"])
    publish_channel = await connection.channel(publisher_confirms=True)
    queue = await publish_channel.declare_queue(queue_name, durable=True, arguments={"x-queue-type": "quorum"})
    await queue.purge()
    exchange = publish_channel.default_exchange

    def message_for(run_id: str, revision: int) -> aio_pika.Message:
        body = {**template, "event_id": str(uuid.uuid4()), "run_id": run_id, "expected_state_version": revision}
        return aio_pika.Message(body=json.dumps(body).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                content_type="application/json", headers={"cloudEvents:type": "run.wakeup"})

    # Each run in flight starts with its current revision.
    first = await conns.get()
    cur = await first.execute("SELECT run_id, revision FROM runs WHERE run_id = ANY(%s)",
                              ([f"bench-{args.offset + i}" for i in range(args.inflight)],))
    start_rows = await cur.fetchall()
    await first.commit()
    conns.put_nowait(first)
    for run_id, revision in start_rows:
        await exchange.publish(message_for(run_id, revision), routing_key=queue_name)

    steps = 0
    measuring = False
    errors = 0

    async def handle(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
        nonlocal steps, errors
        body = json.loads(msg.body)
        run_id, revision = body["run_id"], body["expected_state_version"]
        conn = await conns.get()
        try:
            async with conn.transaction():
                claimed = await (await conn.execute(
                    "INSERT INTO inbox_worker (message_id, message_type, run_id, outcome) "
                    "VALUES (%s, 'run.wakeup', %s, '{}') ON CONFLICT DO NOTHING RETURNING message_id",
                    (body["event_id"], run_id))).fetchone()
                if claimed is None:
                    await msg.ack()
                    return
                row = await (await conn.execute(
                    "UPDATE runs SET revision = revision + 1, last_seq = last_seq + 1, updated_at = now(), "
                    "snapshot = jsonb_set(snapshot, '{revision}', to_jsonb(revision + 1)) "
                    "WHERE run_id = %s AND revision = %s RETURNING last_seq", (run_id, revision))).fetchone()
                if row is None:
                    raise RuntimeError(f"revision conflict on {run_id}")
                await conn.execute(
                    "INSERT INTO run_events (run_id, seq, event_id, type, data, applied, fencing_token, occurred_at) "
                    "VALUES (%s, %s, %s, 'action.confirmed', %s, true, 1, now())",
                    (run_id, row[0], f"{run_id}:{row[0]}", EVENT_DATA))
                nxt = message_for(run_id, revision + 1)
                await conn.execute(
                    "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, partition, exchange, routing_key, "
                    "type, payload) VALUES (%s, 'run', %s, 0, '', %s, 'run.wakeup', %s)",
                    (json.loads(nxt.body)["event_id"], run_id, queue_name, nxt.body.decode()))
        except Exception:
            errors += 1
            conns.put_nowait(conn)
            await msg.nack(requeue=True)
            return
        conns.put_nowait(conn)
        await exchange.publish(nxt, routing_key=queue_name)
        await msg.ack()
        if measuring:
            steps += 1

    consume_channel = await connection.channel()
    await consume_channel.set_qos(prefetch_count=100)
    consume_queue = await consume_channel.get_queue(queue_name)
    tasks: set[asyncio.Task[None]] = set()

    async def on_message(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
        task = asyncio.create_task(handle(msg))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    tag = await consume_queue.consume(on_message)
    await asyncio.sleep(min(1.0, args.seconds / 5))  # warm up: connections, prepared statements
    cpu0 = os.times()
    measuring = True
    t0 = time.monotonic()
    await asyncio.sleep(args.seconds)
    measuring = False
    elapsed = time.monotonic() - t0
    cpu1 = os.times()
    await consume_queue.cancel(tag)
    await asyncio.gather(*tasks, return_exceptions=True)
    await publish_channel.queue_delete(queue_name)
    await connection.close()
    while not conns.empty():
        await (conns.get_nowait()).close()
    cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / elapsed
    return {"steps": steps, "seconds": round(elapsed, 2), "steps_per_s": round(steps / elapsed, 1),
            "process_cpu_pct": round(100 * cpu, 1), "errors": errors, "db_connections": DB_CONNECTIONS,
            "inflight": args.inflight}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--offset", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result = runner.run(main_async(args))
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
