"""Replica membership and partition leases, in PostgreSQL time.

A replica renews its membership row and the leases of the partitions assigned to it.
Assignment is a pure function of the live member list (``assign``), so every replica
computes the same split; a lease row makes "who consumes partition k" a fact that two
replicas cannot both hold: taking it requires it to be free, ours, or expired.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta

from sqlalchemy import func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db.schema import partition_leases, service_members


def assign(members: list[str], partitions: int) -> dict[str, set[int]]:
    """Partition k goes to the (k mod n)-th member in sorted order: even and deterministic."""
    ordered = sorted(members)
    shares: dict[str, set[int]] = {m: set() for m in ordered}
    for k in range(partitions):
        if ordered:
            shares[ordered[k % len(ordered)]].add(k)
    return shares


async def heartbeat(conn: AsyncConnection, service: str, instance_id: str, ttl: float,
                    advertised: Sequence[Mapping[str, str]] = ()) -> list[str]:
    """Renew our membership (with what we can run); return the live members that share the partitions
    (ourselves included): a stopping member (``stopping``) is not one of them."""
    until = func.now() + timedelta(seconds=ttl)
    await conn.execute(
        insert(service_members).values(service=service, instance_id=instance_id, alive_until=until,
                                       advertised=list(advertised))
        .on_conflict_do_update(index_elements=["service", "instance_id"],
                               set_={"alive_until": until, "advertised": list(advertised), "stopping": False})
    )
    rows = await conn.execute(
        select(service_members.c.instance_id)
        .where(service_members.c.service == service, service_members.c.alive_until > func.now(),
               service_members.c.stopping.is_(False))
    )
    return [r[0] for r in rows]


async def stopping(conn: AsyncConnection, service: str, instance_id: str, ttl: float) -> None:
    """Renew our membership as a replica that is stopping: it stays a member while it finishes what
    it holds in its name (a worker's runs and tool permits are not taken over from it), and the others
    leave it out of the partitions' split at once."""
    await conn.execute(update(service_members).where(service_members.c.service == service,
                                                     service_members.c.instance_id == instance_id)
                       .values(alive_until=func.now() + timedelta(seconds=ttl), stopping=True))


async def ensure_partitions(conn: AsyncConnection, service: str, partitions: int) -> None:
    await conn.execute(
        insert(partition_leases)
        .values([{"service": service, "partition": k} for k in range(partitions)])
        .on_conflict_do_nothing()
    )


async def acquire(conn: AsyncConnection, service: str, instance_id: str, partitions: set[int],
                  ttl: float) -> set[int]:
    """Take or renew leases on ``partitions``; return those we now hold."""
    if not partitions:
        return set()
    table = partition_leases
    rows = await conn.execute(
        update(table)
        .where(table.c.service == service, table.c.partition.in_(sorted(partitions)),
               (table.c.owner.is_(None)) | (table.c.owner == instance_id) | (table.c.lease_until <= func.now()))
        .values(owner=instance_id, lease_until=func.now() + timedelta(seconds=ttl),
                fencing_token=table.c.fencing_token
                + text("CASE WHEN partition_leases.owner IS DISTINCT FROM :me THEN 1 ELSE 0 END")
                .bindparams(me=instance_id))
        .returning(table.c.partition)
    )
    return {r[0] for r in rows}


async def release(conn: AsyncConnection, service: str, instance_id: str, partitions: set[int]) -> None:
    if partitions:
        await conn.execute(
            update(partition_leases)
            .where(partition_leases.c.service == service, partition_leases.c.owner == instance_id,
                   partition_leases.c.partition.in_(sorted(partitions)))
            .values(owner=None, lease_until=None)
        )


async def leave(conn: AsyncConnection, service: str, instance_id: str) -> None:
    """Lapse this replica's membership now, as if it had died: it leaves the live member list at once,
    and the runs a stopping worker still holds are taken over by the live workers (``db.leases``)
    rather than waiting out their leases. Retention deletes the row with the other lapsed ones."""
    await conn.execute(update(service_members).where(service_members.c.service == service,
                                                     service_members.c.instance_id == instance_id)
                       .values(alive_until=func.now()))
