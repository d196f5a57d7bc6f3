"""The scheduler's admission round on PostgreSQL: each tenant with queued runs, under its advisory
lock, admits its best queued runs (``db.admission.ADMIT_BEST``) into its free slots (its own slots,
else the platform's; none while its budget for the period is spent) and wakes them."""

from __future__ import annotations

from collections.abc import Sequence

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
        rows = await conn.execute(admission.ADMIT_BEST, {"t": tenant, "aging": aging_seconds, "n": free})
        chosen = sorted(rows, key=lambda r: (-r.score, r.created_at))
        for r in chosen:
            metrics.ADMISSION_DELAY.labels(r.workflow).observe(max(0.0, float(r.waited)))
        await outbox.enqueue_many(conn, [effects.wake_message_of(
            tenant_id=r.tenant_id, run_id=r.run_id, revision=r.revision, partition=r.partition, reason="admitted",
            producer=PRODUCER, cause=f"admission:{tenant}") for r in chosen])
        admitted += [r.run_id for r in chosen]
    return admitted


async def _lock_tenant(conn: AsyncConnection, tenant: str) -> None:
    await conn.execute(admission.LOCK_TENANT, {"t": tenant})


async def _free(conn: AsyncConnection, tenant: str, slots: int) -> int:
    """The tenant's free slots (its own slots, else ``slots``); none while its budget is spent."""
    room = (await conn.execute(ROOM, {"t": tenant, "slots": slots})).one()
    return 0 if room.spent else room.slots - room.active
