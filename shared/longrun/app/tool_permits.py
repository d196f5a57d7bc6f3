"""A freed tool permit wakes one run waiting for its group (``domain.tool_permits``): the worker that
released it, or the reconciler that freed a lapsed worker's, wakes it in the transaction that freed it.
Woken, the run is queued (its wait held no slot): admission is told, admits it and wakes it, and it asks
for a permit again."""

from __future__ import annotations

from longrun.app import effects
from longrun.domain import RunStatus, WakeReason
from longrun.domain import events as ev
from longrun.ports.stores import RunTransaction


async def wake_waiter(tx: RunTransaction, run_id: str, key: str, at: float, *, producer: str) -> int:
    """Wake ``run_id`` if it still waits on ``key`` for a permit; how many runs were woken (0 or 1)."""
    return await wake_if_waiting(tx, run_id, key, at, producer=producer, why="a permit was freed")


async def wake_if_waiting(tx: RunTransaction, run_id: str, key: str, at: float, *, producer: str, why: str) -> int:
    """Wake ``run_id`` if it still waits on ``key`` (``why``: what the wakeup's reason says after the
    key); how many runs were woken (0 or 1). A far side's health wakes its waiters this way too."""
    stored = await tx.load(run_id, lock=True)
    wait = None if stored is None else stored.snapshot.wait
    if stored is None or stored.snapshot.status is not RunStatus.RETRY_SCHEDULED or wait is None \
            or wait.correlation_key != key:
        return 0
    after = await tx.append(stored, [ev.RunWoken(seq=stored.seq(1), at=at, wait_id=wait.wait_id,
                                                 reason=WakeReason.EVENT, correlation_key=key)])
    broadcast = effects.broadcast_message(stored.snapshot, after, producer=producer, cause=key)
    wakeup = effects.wake_unless_queued(after, reason=f"{key}: {why}", producer=producer, cause=key)
    await tx.send([m for m in (broadcast, wakeup) if m is not None])
    if wakeup is None:
        await tx.notify(effects.ADMISSION_CHANNEL, after.snapshot.tenant_id)
    return 1
