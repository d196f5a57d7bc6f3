"""The reconciler's sweep of expired leases: a run whose worker stopped renewing its lease gets one wakeup.

Responsibility:
- ``rewake_expired``: clear expired leases, waking each run a worker has work for; written against
  ``ports.stores.ReconcileStore`` (PostgreSQL: ``db.reconcile_store``, run by the reconciler service's
  sweeps; memory: ``longrun.testing.reconcile_store``).

Invariants:
- A lease is cleared in the transaction that enqueues its wakeup, so each expiry wakes its run
  once, however many replicas sweep at once.
- ``WORKER_HAS_WORK`` (what a worker has work for once the lease is free) is also the rule by which
  the reconciler's dead-letter sweep wakes a run again whose wakeup was dead-lettered.
"""

from __future__ import annotations

import logging

from longrun import metrics
from longrun.app import effects
from longrun.app.reconciler.common import METRICS, PRODUCER
from longrun.domain import WORKER_HAS_WORK
from longrun.domain.lease import LEASE_EXPIRED, recovery_cause
from longrun.ports.runs import Message as Outgoing
from longrun.ports.runs import StoredRun
from longrun.ports.stores import ExpiredLease, ReconcileStore

logger = logging.getLogger(__name__)


async def rewake_expired(store: ReconcileStore, *, limit: int) -> int:
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
        async with store.transaction() as tx:
            expired = await tx.clear_expired(limit)
            if not expired:
                return 0
            stored = await tx.load_many([lease.run_id for lease in expired])
            woken = [lease for lease in expired if stored[lease.run_id].snapshot.status in WORKER_HAS_WORK]
            await tx.send([_rewake(stored[lease.run_id], lease) for lease in woken])
    except Exception as e:
        if store.unreachable(e):
            raise
        logger.warning("re-waking expired leases together failed (%r); run by run", e)
        return await _rewake_one_by_one(store, limit=limit)
    for lease in expired:
        _count_expiry(lease, stored[lease.run_id], wake=stored[lease.run_id].snapshot.status in WORKER_HAS_WORK)
    return len(woken)


async def _rewake_one_by_one(store: ReconcileStore, *, limit: int) -> int:
    woken = 0
    failed: set[str] = set()
    for _ in range(limit):
        current: str | None = None
        try:
            async with store.transaction() as tx:
                lease = await tx.clear_one_expired(failed)
                if lease is None:
                    break
                current = lease.run_id
                stored = await tx.load(lease.run_id)
                assert stored is not None
                wake = stored.snapshot.status in WORKER_HAS_WORK
                if wake:
                    await tx.send([_rewake(stored, lease)])
        except Exception as e:
            if store.unreachable(e) or current is None:
                raise
            logger.exception("run %s: could not re-wake after its lease expired; skipped this sweep", current)
            failed.add(current)
            continue
        _count_expiry(lease, stored, wake=wake)
        woken += wake
    return woken


def _count_expiry(lease: ExpiredLease, stored: StoredRun, *, wake: bool) -> None:
    METRICS["lease.expired"] += 1
    metrics.LEASE_EXPIRIES.inc()
    if wake:
        METRICS["lease.rewoken"] += 1
        metrics.LEASE_REWAKES.inc()
        metrics.RECOVERIES.labels(LEASE_EXPIRED).inc()
    logger.info("run %s: lease %d of %s expired (%s)%s", lease.run_id, lease.fencing_token, lease.lease_owner,
                stored.snapshot.status.value, "; woken" if wake else "")


def _rewake(stored: StoredRun, lease: ExpiredLease) -> Outgoing:
    """The run's wakeup after its lease expired, naming that lease as its cause."""
    return effects.wake_message(stored, reason="lease expired", producer=PRODUCER,
                                cause=recovery_cause(LEASE_EXPIRED, lease.lease_owner, lease.fencing_token))
