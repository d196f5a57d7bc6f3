"""The reconciler's sweep of expired leases: a run whose worker stopped renewing its lease gets one wakeup.

Responsibility:
- ``rewake_expired_leases``: clear expired leases, waking each run a worker has work for.
- ``seconds_until_a_lease_expires``: how long the service may sleep before the next lease runs out.

Invariants:
- A lease is cleared in the transaction that enqueues its wakeup, so each expiry wakes its run
  once, however many replicas sweep at once.
- ``_WAKEABLE`` (what a worker has work for once the lease is free) is also the rule by which
  ``reconcile_dead_letters`` wakes a run again whose wakeup was dead-lettered.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.app import effects
from longrun.app.reconcile_common import METRICS, PRODUCER
from longrun.db import outbox, runs
from longrun.db.errors import is_transient
from longrun.db.runs import StoredRun
from longrun.domain import RunStatus

logger = logging.getLogger(__name__)

# A worker has something to do for these once the lease is free; the rest are parked or finished.
_WAKEABLE = frozenset({RunStatus.READY, RunStatus.RUNNING, RunStatus.CANCELLING})

_EXPIRED = "lease_owner IS NOT NULL AND lease_until < now()"
_CLEAR_EXPIRED = text(
    "UPDATE runs AS r SET lease_owner = NULL, lease_until = NULL "
    f"FROM (SELECT run_id, lease_owner, fencing_token FROM runs WHERE {_EXPIRED} "
    "      ORDER BY lease_until LIMIT :limit FOR UPDATE SKIP LOCKED) AS e "
    "WHERE r.run_id = e.run_id "
    "RETURNING r.run_id, e.lease_owner, e.fencing_token")
_CLEAR_ONE_EXPIRED = text(
    "UPDATE runs AS r SET lease_owner = NULL, lease_until = NULL "
    f"FROM (SELECT run_id, lease_owner, fencing_token FROM runs WHERE {_EXPIRED} "
    "        AND run_id <> ALL(CAST(:failed AS text[])) "
    "      ORDER BY lease_until LIMIT 1 FOR UPDATE SKIP LOCKED) AS e "
    "WHERE r.run_id = e.run_id "
    "RETURNING r.run_id, e.lease_owner, e.fencing_token")


_NEXT_EXPIRY = text("SELECT extract(epoch FROM min(lease_until) - now()) FROM runs WHERE lease_owner IS NOT NULL")


async def seconds_until_a_lease_expires(engine: AsyncEngine) -> float | None:
    """Seconds (database clock) until the earliest held lease runs out; <= 0 when one has, None when none is held."""
    async with engine.connect() as conn:
        seconds = (await conn.execute(_NEXT_EXPIRY)).scalar()
    return None if seconds is None else float(seconds)


async def rewake_expired_leases(engine: AsyncEngine, *, limit: int) -> int:
    """Clear up to ``limit`` expired leases, waking each run a worker has work for; returns the wakeups.

    The lease is cleared in the transaction that enqueues the wakeup, so each expiry wakes
    the run once and the next sweep no longer sees it. Clearing is safe: the old holder's
    writes and renewals need its owner and fencing token, which no longer match, and the
    next ``take_lease`` bumps the token. Expired leases of finished or parked runs are
    cleared without a wakeup.

    A dead worker leaves many leases expiring together, and every one of them delays its run,
    so they are cleared in one statement and woken with one outbox insert; only if that
    transaction fails for another reason than the database being away is the sweep redone run
    by run, so one run that cannot be woken does not hold up the others.
    """
    try:
        async with engine.begin() as conn:
            expired = (await conn.execute(_CLEAR_EXPIRED, {"limit": limit})).all()
            if not expired:
                return 0
            stored = await runs.load_many(conn, [row.run_id for row in expired])
            woken = [stored[row.run_id] for row in expired if stored[row.run_id].snapshot.status in _WAKEABLE]
            await outbox.enqueue_many(conn, [effects.wake_message(s, reason="lease expired", producer=PRODUCER)
                                             for s in woken])
    except Exception as e:
        if is_transient(e):
            raise
        logger.warning("re-waking expired leases together failed (%r); run by run", e)
        return await _rewake_one_by_one(engine, limit=limit)
    for row in expired:
        _count_expiry(row, stored[row.run_id], wake=stored[row.run_id].snapshot.status in _WAKEABLE)
    return len(woken)


async def _rewake_one_by_one(engine: AsyncEngine, *, limit: int) -> int:
    woken = 0
    failed: set[str] = set()
    for _ in range(limit):
        current: str | None = None
        try:
            async with engine.begin() as conn:
                row = (await conn.execute(_CLEAR_ONE_EXPIRED, {"failed": sorted(failed)})).first()
                if row is None:
                    break
                current = row.run_id
                stored = await runs.load(conn, row.run_id)
                assert stored is not None
                wake = stored.snapshot.status in _WAKEABLE
                if wake:
                    await effects.wake(conn, stored, reason="lease expired", producer=PRODUCER)
        except Exception as e:
            if is_transient(e) or current is None:
                raise
            logger.exception("run %s: could not re-wake after its lease expired; skipped this sweep", current)
            failed.add(current)
            continue
        _count_expiry(row, stored, wake=wake)
        woken += wake
    return woken


def _count_expiry(row: Any, stored: StoredRun, *, wake: bool) -> None:
    METRICS["lease.expired"] += 1
    if wake:
        METRICS["lease.rewoken"] += 1
    logger.info("run %s: lease %d of %s expired (%s)%s", row.run_id, row.fencing_token, row.lease_owner,
                stored.snapshot.status.value, "; woken" if wake else "")
