"""Shared steps for bus tests: build probe wakeups, publish them, read what was applied."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun.bus import topology
from longrun.bus.codec import to_message
from longrun.bus.connection import Bus
from longrun.db import outbox
from longrun.envelope import Envelope, make
from tests.fixtures import PARTITIONS
from tests.probe_consumer import PROBE_TABLE


def wakeup(run_id: str, label: str) -> Envelope:
    """A probe wakeup; ``label`` travels as its reason (what the outbox keeps of it) and its wakeup id."""
    return make("run.wakeup", {"wakeup_id": label, "reason": label}, producer="tests",
                tenant_id="tenant-a", run_id=run_id)


def route(run_id: str) -> tuple[str, str, int]:
    k = topology.partition_of(run_id, PARTITIONS)
    return topology.work_exchange("worker"), topology.partition_key(k), k


async def publish(bus: Bus, envelope: Envelope) -> None:
    assert envelope.run_id is not None
    exchange, key, _ = route(envelope.run_id)
    await bus.publish(exchange, key, to_message(envelope))


async def enqueue(conn: AsyncConnection, envelope: Envelope) -> None:
    assert envelope.run_id is not None
    exchange, key, k = route(envelope.run_id)
    await outbox.enqueue(conn, envelope, exchange=exchange, routing_key=key, partition=k)


async def create_probe_table(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(text(PROBE_TABLE))
        await conn.execute(text("TRUNCATE probe_handled"))


async def applied(engine: AsyncEngine) -> list[tuple[str, str, str]]:
    """(run_id, wakeup_id, consumer) in the order the consumers committed them."""
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT run_id, wakeup_id, consumer FROM probe_handled ORDER BY id"))
        return [tuple(r) for r in rows]  # type: ignore[misc]


async def scalar(engine: AsyncEngine, sql: str) -> object:
    async with engine.connect() as conn:
        return (await conn.execute(text(sql))).scalar()
