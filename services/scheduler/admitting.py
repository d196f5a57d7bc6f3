"""The scheduler's admission round on PostgreSQL: each tenant with queued runs, under its advisory
lock, admits its best queued runs (``db.admission.ADMIT_BEST``) into its free slots (its own slots,
else the platform's; none while its budget for the period is spent) and wakes them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun import metrics
from longrun.app import effects
from longrun.app.scheduler.admit import PRODUCER
from longrun.db import admission, outbox
from longrun.db.schema import QUEUED


ROOM = text(admission.tenant_slots(":t"))


QUEUED_TENANTS = text(f"SELECT DISTINCT tenant_id FROM runs WHERE {QUEUED}")


async def queued_tenants(conn: AsyncConnection) -> list[str]:
    """Tenants with a run waiting for a slot."""
    return list((await conn.execute(QUEUED_TENANTS)).scalars())


async def admit(conn: AsyncConnection, *, slots: int, aging_seconds: float,
                tenants: Sequence[str] | None = None) -> list[str]:
    """Admit what the free slots of ``tenants`` (default: every tenant with a queued run) allow;
    returns the admitted run ids."""
    if tenants is None:
        tenants = await queued_tenants(conn)
    admitted: list[str] = []
    for tenant in sorted(tenants):
        await _lock_tenant(conn, tenant)
        free = await _free(conn, tenant, slots)
        if free <= 0:
            continue
        chosen = await _admit_best(conn, tenant, aging_seconds, free)
        for r in chosen:
            metrics.ADMISSION_DELAY.labels(r.workflow).observe(max(0.0, float(r.waited)))
        await outbox.enqueue_many(conn, [effects.wake_message_of(
            tenant_id=r.tenant_id, run_id=r.run_id, revision=r.revision, partition=r.partition, reason="admitted",
            producer=PRODUCER, cause=f"admission:{tenant}") for r in chosen])
        admitted += [r.run_id for r in chosen]
    return admitted


async def _admit_best(conn: AsyncConnection, tenant: str, aging_seconds: float, free: int) -> list[Any]:
    """The tenant's best queued runs admitted into ``free`` slots, best first. Runs that took one
    concurrency key in one statement each saw the room it had before it: those past the room go back
    to the queue (``_past_room``), and while a statement admitted runs with a key and left slots free,
    it is asked again. A statement that admitted no run with a key is the only one."""
    chosen: list[Any] = []
    while free > 0:
        rows = list(await conn.execute(admission.ADMIT_BEST, {"t": tenant, "aging": aging_seconds, "n": free}))
        past = await _past_room(conn, tenant, rows)
        rows = [r for r in rows if r.run_id not in past]
        chosen += rows
        free -= len(rows)
        if not any(r.concurrency_key is not None for r in rows):
            break
    # Scored at the transaction's time: one order over every statement's runs.
    return sorted(chosen, key=lambda r: (-r.score, r.created_at))


async def _past_room(conn: AsyncConnection, tenant: str, rows: Sequence[Any]) -> set[str]:
    """The runs of ``rows`` that took a key past its room (the worst scored of a key taken more than
    once), given back to the queue; the key's holders are read only when one statement took it twice."""
    taking: dict[str, list[Any]] = {}
    for r in rows:
        if r.took_key:
            taking.setdefault(r.concurrency_key, []).append(r)
    past: set[str] = set()
    for key, took in taking.items():
        if len(took) < 2:
            continue
        up_to = max(r.concurrency_limit for r in took) + len(took)
        before = (await conn.execute(admission.KEY_HOLDERS, {"t": tenant, "k": key, "n": up_to})).scalar_one() - len(took)
        kept = 0
        for r in sorted(took, key=lambda r: (-r.score, r.created_at)):  # each within its own limit, best first
            if before + kept < r.concurrency_limit:
                kept += 1
            else:
                past.add(r.run_id)
    if past:
        await conn.execute(admission.GIVE_BACK, {"ids": json.dumps(sorted(past))})
    return past


async def _lock_tenant(conn: AsyncConnection, tenant: str) -> None:
    await conn.execute(admission.LOCK_TENANT, {"t": tenant})


async def _free(conn: AsyncConnection, tenant: str, slots: int) -> int:
    """The tenant's free slots (its own slots, else ``slots``); none while its budget is spent."""
    room = (await conn.execute(ROOM, {"t": tenant, "slots": slots})).one()
    return 0 if room.spent else room.slots - room.active
