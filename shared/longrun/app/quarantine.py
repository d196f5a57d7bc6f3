"""Quarantine operations: list what was quarantined and why; replay one message after re-validating it.

Replay is one message at a time and never blind: the stored body is decoded again with
the current registry (a message that is still poison stays in quarantine, with the new
reason returned), then published with confirms to where it was first sent, and the
entry is marked replayed with who did it, in the audit log too.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.app.webhooks import audit
from longrun.bus import topology
from longrun.bus.codec import to_message
from longrun.bus.connection import Bus
from longrun.db import quarantine as rows
from longrun.db.schema import quarantine
from longrun.envelope import decode
from longrun.errors import PoisonMessage


class NotReplayable(Exception):
    pass


def destination(queue: str) -> tuple[str, str]:
    """(exchange, routing key) that feeds ``queue``, from the declared topology."""
    if queue == topology.SCHEDULER_INGRESS_QUEUE:
        return topology.INGRESS_EXCHANGE, "run.create"
    for service in topology.PARTITIONED_SERVICES:
        prefix = topology.partition_queue(service, 0)[:-1]
        if queue.startswith(prefix) and queue[len(prefix):].isdigit():
            return topology.work_exchange(service), topology.partition_key(int(queue[len(prefix):]))
    raise NotReplayable(f"queue {queue!r} is not fed by a longrun exchange")


async def list_entries(engine: AsyncEngine, *, include_replayed: bool = False) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        entries = await rows.list_entries(conn, include_replayed=include_replayed)
    return [{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in e.items() if k != "body"}
            | {"body_preview": e["body"][:200].decode(errors="replace")} for e in entries]


async def replay(engine: AsyncEngine, bus: Bus, entry_id: int, *, actor: str, reason: str) -> dict[str, Any]:
    async with engine.connect() as conn:
        entry = (await conn.execute(select(quarantine).where(quarantine.c.id == entry_id))).first()
    if entry is None:
        raise NotReplayable(f"no quarantine entry {entry_id}")
    if entry.replayed_at is not None:
        raise NotReplayable(f"entry {entry_id} was already replayed by {entry.replayed_by}")
    try:
        envelope = decode(entry.body)
    except PoisonMessage as e:
        raise NotReplayable(f"still invalid: {e}") from e
    exchange, key = destination(entry.queue)
    await bus.publish(exchange, key, to_message(envelope))
    async with engine.begin() as conn:
        await rows.mark_replayed(conn, entry_id, by=actor)
        await audit(conn, actor=actor, action="quarantine.replay", target=str(entry_id), reason=reason,
                    details={"queue": entry.queue, "message_id": entry.message_id})
    return {"id": entry_id, "replayed_to": f"{exchange}/{key}", "message_id": envelope.event_id}
