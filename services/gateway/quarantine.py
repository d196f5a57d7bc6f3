"""Quarantine operations: list what was quarantined and why; replay one message after re-validating it.

Replay is one message at a time and never blind: the stored body is decoded again with
the current registry (a message that is still poison stays in quarantine, with the new
reason returned), then published with confirms to where it was first sent, and the
entry is marked replayed with who did it, in the audit log too.

Within the replay window a consumer's inbox still holds the row of a message it handled before
(the inbox is kept longer than the window), so a replayed duplicate changes nothing. A message
older than the window may have outlived its inbox row: it is checked first against what outlives
the inbox (``already_applied``): a ``run.create`` against the runs by its creating key (a pruned
run's tombstone keeps it), a ``run.wakeup`` against its run's state (a finished run takes no
wakeup; an open run's effects are keyed in its action ledger, which is never pruned while it is
open). One whose effect is already there is not sent again: the entry is marked replayed, and the
answer says why. A message of any other type that old is refused.
"""

from __future__ import annotations

from typing import Any

from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun.bus import topology
from longrun.bus.codec import to_message
from longrun.bus.connection import Bus
from longrun.db import quarantine as rows
from longrun.db import runs
from longrun.db.audit import audit
from longrun.domain import TERMINAL
from longrun.envelope import Envelope, decode
from longrun.errors import PoisonMessage


class NotReplayable(Exception):
    """The entry is there, and why it is not sent again."""


class NoSuchEntry(LookupError):
    """No quarantine entry of that id."""


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


def past_window(envelope: Envelope, first_failure_at: datetime, now: datetime, window: float) -> bool:
    """Whether the message may be older than its inbox rows: sent (or first failed, if the sender's
    clock says later) more than ``window`` seconds before ``now``."""
    return now - min(envelope.occurred_at, first_failure_at) > timedelta(seconds=window)


async def already_applied(conn: AsyncConnection, envelope: Envelope) -> str | None:
    """Why a message past the window must not be sent again (its effect is there), or None."""
    if envelope.type == "run.create":
        found = await runs.find(conn, envelope.tenant_id, envelope.payload.idempotency_key)
        return None if found is None else (
            f"run.create of key {envelope.payload.idempotency_key!r} already made run {found.run_id}")
    if envelope.type == "run.wakeup" and envelope.run_id is not None:
        stored = await runs.load(conn, envelope.run_id)
        if stored is None:
            return f"no run {envelope.run_id} to wake"
        if stored.snapshot.status in TERMINAL:
            return f"run {envelope.run_id} already finished ({stored.snapshot.status.value})"
        return None
    raise NotReplayable(f"a {envelope.type} older than the replay window cannot be checked against what "
                        "outlives the inbox, so it is not sent again")


async def replay(engine: AsyncEngine, bus: Bus, entry_id: int, *, actor: str, reason: str,
                 replay_window: float) -> dict[str, Any]:
    async with engine.connect() as conn:
        entry = await rows.entry(conn, entry_id)
        if entry is None:
            raise NoSuchEntry(f"no quarantine entry {entry_id}")
        if entry.replayed_at is not None:
            raise NotReplayable(f"entry {entry_id} was already replayed by {entry.replayed_by}")
        try:
            envelope = decode(entry.body)
        except PoisonMessage as e:
            raise NotReplayable(f"still invalid: {e}") from e
        applied = (await already_applied(conn, envelope)
                   if past_window(envelope, entry.first_failure_at, entry.now, replay_window) else None)
    if applied is not None:
        async with engine.begin() as conn:
            await rows.mark_replayed(conn, entry_id, by=actor)
            await audit(conn, actor=actor, action="quarantine.replay", target=str(entry_id), reason=reason,
                        details={"queue": entry.queue, "message_id": entry.message_id, "not_sent": applied})
        return {"id": entry_id, "not_sent": applied, "message_id": envelope.event_id}
    exchange, key = destination(entry.queue)
    await bus.publish(exchange, key, to_message(envelope))
    async with engine.begin() as conn:
        await rows.mark_replayed(conn, entry_id, by=actor)
        await audit(conn, actor=actor, action="quarantine.replay", target=str(entry_id), reason=reason,
                    details={"queue": entry.queue, "message_id": entry.message_id})
    return {"id": entry_id, "replayed_to": f"{exchange}/{key}", "message_id": envelope.event_id}
