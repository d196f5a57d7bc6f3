"""Outbox: messages written in the same transaction as the state change that causes them.

The relay publishes unpublished rows per partition in id order and marks them sent
after the broker confirms. A NOTIFY (delivered only at commit) wakes it early; it
polls anyway, because NOTIFY is a hint with no replay.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db.schema import outbox
from longrun.envelope import Envelope

NOTIFY_CHANNEL = "longrun_outbox"


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    event_id: str
    partition: int
    exchange: str
    routing_key: str
    type: str
    payload: dict[str, Any]


async def enqueue(conn: AsyncConnection, envelope: Envelope, *, exchange: str, routing_key: str,
                  partition: int, aggregate_type: str = "run") -> None:
    await conn.execute(outbox.insert().values(
        event_id=envelope.event_id,
        aggregate_type=aggregate_type,
        aggregate_id=envelope.run_id or envelope.event_id,
        partition=partition,
        exchange=exchange,
        routing_key=routing_key,
        type=envelope.type,
        payload=json.loads(envelope.model_dump_json()),
        traceparent=envelope.trace,
    ))
    await conn.execute(text("SELECT pg_notify(:channel, :partition)"),
                       {"channel": NOTIFY_CHANNEL, "partition": str(partition)})


async def unpublished(conn: AsyncConnection, partition: int, limit: int) -> list[OutboxRow]:
    """Oldest unpublished rows of one partition; every round rescans, so late commits are seen."""
    rows = await conn.execute(
        select(outbox.c.id, outbox.c.event_id, outbox.c.partition, outbox.c.exchange,
               outbox.c.routing_key, outbox.c.type, outbox.c.payload)
        .where(outbox.c.partition == partition, outbox.c.published_at.is_(None))
        .order_by(outbox.c.id)
        .limit(limit)
    )
    return [OutboxRow(*row) for row in rows]


async def mark_published(conn: AsyncConnection, ids: list[int]) -> None:
    if ids:
        await conn.execute(update(outbox).where(outbox.c.id.in_(ids)).values(published_at=func.now()))
