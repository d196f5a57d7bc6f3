"""An operator's raise of a tenant's budget ends its runs' budget waits at once: each run parked on
``tenant_budget:<tenant>`` is woken in the transaction that wrote the raise, and asks the model again
(or parks again, if the raise was not enough)."""

from __future__ import annotations

from collections.abc import Sequence

from longrun.app import effects
from longrun.domain import RunStatus, WakeReason
from longrun.domain import events as ev
from longrun.domain.tenant_limits import TENANT_BUDGET_PREFIX
from longrun.ports.stores import RunTransaction

PRODUCER = "operator"


async def wake_waiters(tx: RunTransaction, tenant_id: str, run_ids: Sequence[str], at: float) -> int:
    """Wake those of ``run_ids`` still waiting for the tenant's budget; how many were woken."""
    key = f"{TENANT_BUDGET_PREFIX}{tenant_id}"
    woken = 0
    for run_id in sorted(run_ids):
        stored = await tx.load(run_id, lock=True)
        wait = None if stored is None else stored.snapshot.wait
        if stored is None or stored.snapshot.status is not RunStatus.RETRY_SCHEDULED or wait is None \
                or wait.correlation_key != key:
            continue
        after = await tx.append(stored, [ev.RunWoken(seq=stored.seq(1), at=at, wait_id=wait.wait_id,
                                                     reason=WakeReason.EVENT, correlation_key=key)])
        broadcast = effects.broadcast_message(stored.snapshot, after, producer=PRODUCER, cause=key)
        # Queued (the wait held no slot): the caller tells admission, which wakes the runs it admits.
        wakeup = effects.wake_unless_queued(after, reason=f"{key}: budget raised", producer=PRODUCER, cause=key)
        await tx.send([m for m in (broadcast, wakeup) if m is not None])
        woken += 1
    return woken
