"""Publish -> terminal event received on the bus: the latency a producer sees that waits for its run's
outcome where a downstream consumer gets it, not in PostgreSQL.

The producer (``bench.ensemble.Producer``) publishes ``run.create`` with confirms as in
``Ensemble.lone``; beside it, a connection of its own consumes the tenant's terminal status events
(``<tenant>.run.status.<terminal status>`` on the events exchange) from a queue bound before the
first publish, as any consumer binds them. One run at a time, each published once the previous
one's terminal event arrived; the time runs from the publish to the event's delivery in this
process. The first run warms every pool and is left out, as in ``lone``. The run's correlation id
is its idempotency key (the bench's creates carry none of their own): that is how an event is
matched to its run.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

import aio_pika

from bench.common import percentiles
from longrun.bus import topology
from longrun_client.bus import TERMINAL_STATUSES, status_key

if TYPE_CHECKING:
    from bench.ensemble import Producer

TIMEOUT_S = 30.0


async def lone_runs(producer: Producer, tenant: str, n: int, steps: int) -> dict[str, Any]:
    """``n`` runs of ``steps`` steps published by ``producer`` for ``tenant``, one after the other."""
    prefix = f"bus-{uuid.uuid4().hex[:6]}"
    arrived: dict[str, float] = {}
    statuses: Counter[str] = Counter()
    waiting: dict[str, asyncio.Future[None]] = {}

    async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        at = time.time()
        key = json.loads(message.body).get("correlation_id")
        future = waiting.pop(key, None)
        if future is not None and not future.done():
            arrived[key] = at
            statuses[(message.routing_key or "").rsplit(".", 1)[-1]] += 1
            future.set_result(None)

    connection = await aio_pika.connect(producer.amqp_url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.get_exchange(topology.EVENTS_EXCHANGE, ensure=False)
        queue = await channel.declare_queue(exclusive=True)
        for status in sorted(TERMINAL_STATUSES):
            await queue.bind(exchange, status_key(tenant, status))
        await queue.consume(take, no_ack=True)
        for i in range(n):
            key = f"{prefix}-{i:04d}"
            done = waiting[key] = asyncio.get_running_loop().create_future()
            await producer.create(key, steps)
            try:
                await asyncio.wait_for(done, timeout=TIMEOUT_S)
            except TimeoutError:
                raise RuntimeError(f"no terminal event on the bus for {key} within {TIMEOUT_S:g} s") from None
    ms = [(arrived[key] - producer.published[key]) * 1000 for key in sorted(arrived)]
    return {"runs": n, "steps_per_run": steps, "terminal_event_ms": percentiles(ms[1:] or ms),
            "terminal_statuses": dict(statuses)}
