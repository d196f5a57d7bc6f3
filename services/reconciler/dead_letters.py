"""The reconciler's dead-letter keeper: messages the broker dead-lettered are kept in ``quarantine``.

Responsibility:
- ``ingest_quarantine_queue``: consume ``longrun.quarantine``, keeping each dead letter as a
  ``quarantine`` row with what the broker's headers say of its deaths.
- A run whose wakeup hit the delivery limit is woken again, a few times at most
  (``REWAKES_AFTER_DEAD_LETTER``), by the rule of the lease sweep (``reconcile_leases``).

Invariants:
- A dead letter is acked only after its row committed, and never dropped: one that cannot be
  kept goes back to the queue.
- Dead letters are deduplicated by the inbox, so several replicas may consume at once and a
  redelivered message keeps no second row.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun import metrics
from longrun.app import effects
from longrun.app.reconciler.common import METRICS, PRODUCER
from longrun.bus.connection import Bus
from longrun.bus.topology import QUARANTINE_QUEUE
from longrun.db import inbox, outbox, runs
from longrun.db import quarantine as quarantine_rows
from longrun.db.errors import is_transient
from longrun.domain import WORKER_HAS_WORK
from longrun_client.storable import storable

logger = logging.getLogger(__name__)

QUARANTINE_PREFETCH = 20
INGEST_RETRY_DELAY = 1.0
REWAKES_AFTER_DEAD_LETTER = 3


@dataclass(frozen=True, slots=True)
class _Death:
    """What the broker's ``x-death`` / ``x-first-death-*`` headers say about a dead letter."""

    reason: str
    queue: str
    count: int
    first: datetime | None
    last: datetime | None


async def ingest_quarantine_queue(bus: Bus, engine: AsyncEngine, *, delivery_limit: int | None = None,
                                  prefetch: int = QUARANTINE_PREFETCH) -> None:
    """Consume ``longrun.quarantine`` until cancelled; a message is acked only after its row committed.

    ``delivery_limit`` (the work queues' limit) turns a delivery-limit death into an attempt
    count. After a lost connection the consumer reconnects and resumes; a redelivered
    message is recognised by the inbox and acked without a second row.
    """
    while True:
        await bus.ensure_connected()
        lost = asyncio.ensure_future(bus.lost.wait())
        channel: AbstractChannel | None = None
        try:
            channel = await bus.channel(prefetch=prefetch)
            deliveries: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
            await (await channel.get_queue(QUARANTINE_QUEUE, ensure=False)).consume(deliveries.put)
            while True:
                next_delivery = asyncio.ensure_future(deliveries.get())
                await asyncio.wait({next_delivery, lost}, return_when=asyncio.FIRST_COMPLETED)
                if not next_delivery.done():
                    next_delivery.cancel()
                    break
                await _ingest(engine, next_delivery.result(), delivery_limit)
        except (aiormq.exceptions.AMQPError, aio_pika.exceptions.ChannelInvalidStateError, ConnectionError) as e:
            logger.warning("quarantine consumer lost its channel (%r); reconnecting", e)
            bus.lost.set()
        finally:
            lost.cancel()
            # Closing hands every unacked delivery back to the queue at once, not at disconnect.
            if channel is not None and not channel.is_closed:
                try:
                    await asyncio.shield(channel.close())
                except Exception as e:
                    logger.debug("closing the quarantine channel: %r", e)


async def _ingest(engine: AsyncEngine, message: AbstractIncomingMessage, delivery_limit: int | None) -> None:
    headers = dict(message.headers or {})
    death = _read_death(headers)
    body_id = message.message_id or hashlib.sha256(message.body).hexdigest()
    last = death.last.isoformat() if death.last else "-"
    # Headers and properties are the producer's: what the inbox keeps of them must be storable.
    inbox_id = storable(f"quarantine:{death.queue}:{body_id}:{last}:{death.count}")
    attempts = death.count * (delivery_limit + 1) if delivery_limit and death.reason == "delivery_limit" \
        else death.count
    reason = f"dead-lettered by the broker from {death.queue}: {death.reason}"
    if death.reason == "delivery_limit":
        reason += " (delivered past the queue's limit without an ack: its consumer kept failing on it)"
    while True:
        try:
            async with engine.begin() as conn:
                claim = await inbox.claim(conn, PRODUCER, message_id=inbox_id,
                                          message_type=storable(message.type or "unknown"),
                                          run_id=_text(headers.get("cloudEvents:subject")))
                if isinstance(claim, inbox.Claimed):
                    entry = await quarantine_rows.put(
                        conn, owner=_owner(death.queue), queue=death.queue, body=message.body,
                        headers=_json_safe(headers), message_id=message.message_id, error_code=death.reason,
                        reason=reason, attempts=attempts, first_failure_at=death.first,
                        last_failure_at=death.last)
                    if message.type == "run.wakeup" and death.reason == "delivery_limit":
                        await _rewake_dead_lettered(conn, _text(headers.get("cloudEvents:subject")))
                    await inbox.record_outcome(conn, PRODUCER, message_id=inbox_id, outcome={"quarantine_id": entry})
            break
        except Exception as e:
            if not is_transient(e):
                # Never drop a dead letter: hand it back to the queue and try again later.
                logger.exception("could not keep dead letter %s; returned to %s", body_id, QUARANTINE_QUEUE)
                await asyncio.sleep(INGEST_RETRY_DELAY)
                await message.nack(requeue=True)
                return
            logger.warning("database unavailable keeping dead letter %s (%r); retrying", body_id, e)
            await asyncio.sleep(INGEST_RETRY_DELAY)
    if isinstance(claim, inbox.Claimed):
        METRICS["quarantine.kept"] += 1
        logger.error("dead letter %s from %s kept in quarantine: %s", body_id, death.queue, death.reason)
    try:
        await message.ack()
    except Exception as e:
        # The channel is gone: the broker redelivers, and the inbox absorbs the copy.
        logger.warning("ack of dead letter %s failed (%r); the redelivery will be deduplicated", body_id, e)


async def _rewake_dead_lettered(conn: AsyncConnection, run_id: str | None) -> None:
    """Wake a run again whose wakeup hit the delivery limit, a few times at most.

    A wakeup names its run and carries no state, and a worker killed or cut off with it
    prefetched counts as a delivery: under repeated worker deaths a valid wakeup is
    dead-lettered and its run, unleased, would wait forever. A fresh wakeup starts its count
    anew. One that itself kills every worker keeps coming back, so after
    ``REWAKES_AFTER_DEAD_LETTER`` of them the run is left to an operator (the quarantine list).
    """
    if run_id is None:
        return
    stored = await runs.load(conn, run_id)
    if stored is None or stored.snapshot.status not in WORKER_HAS_WORK or stored.lease_owner is not None:
        return  # ended, parked (its own wake condition holds), or leased (the lease sweep wakes it)
    dead = await quarantine_rows.dead_wakeups(conn, run_id)
    if dead > REWAKES_AFTER_DEAD_LETTER:
        logger.error("run %s: %d wakeups dead-lettered; left to an operator", run_id, dead)
        return
    await outbox.enqueue_many(conn, [effects.wake_message(stored, reason="wakeup dead-lettered", producer=PRODUCER,
                                                          cause=f"dead-letter:{run_id}")])
    METRICS["quarantine.rewoken"] += 1
    metrics.RECOVERIES.labels("wakeup_dead_lettered").inc()
    logger.warning("run %s: its wakeup was dead-lettered (%d so far); woken again", run_id, dead)


def _read_death(headers: Mapping[str, Any]) -> _Death:
    deaths = [d for d in headers.get("x-death") or () if isinstance(d, Mapping)]
    latest = deaths[0] if deaths else {}
    times = [d["time"] for d in deaths if isinstance(d.get("time"), datetime)]
    return _Death(
        reason=_text(headers.get("x-first-death-reason")) or _text(latest.get("reason")) or "unknown",
        queue=_text(headers.get("x-first-death-queue")) or _text(latest.get("queue")) or "unknown",
        count=sum(int(d.get("count") or 1) for d in deaths) or 1,
        first=min(times) if times else None,
        last=max(times) if times else None,
    )


def _owner(queue: str) -> str:
    """The service whose queue it was: ``longrun.<service>.<lane>``."""
    parts = queue.split(".")
    return parts[1] if len(parts) >= 3 and parts[0] == "longrun" else queue


def _text(value: object) -> str | None:
    """A header's text, storable (the producer chose it)."""
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return storable(value) if isinstance(value, str) else None


def _json_safe(value: Any) -> Any:
    """AMQP header values (nested tables, bytes, timestamps, decimals) as JSON values."""
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)
