"""The scheduler's admission round in the memory world, as on PostgreSQL
(``services.scheduler.admitting`` over ``db.admission``): the tenant's queued runs by priority plus one
point per ``aging_seconds`` waited, then age, admitted into its free slots and woken, passing over a
run whose concurrency key its holders fill (counting the runs admitted before it in the round). The
world runs it where PostgreSQL would notify the scheduler: after a create, and after a transition
that rides a notice to admission."""

from __future__ import annotations

from longrun.app import effects
from longrun.app.scheduler.admit import PRODUCER
from longrun.db.schema import QUEUED_STATUS
from longrun.domain import TERMINAL
from longrun.ports.runs import Message
from longrun.testing.memory import MemoryStore


def admit(store: MemoryStore, tenant_id: str, *, slots: int, aging_seconds: float, now: float) -> list[Message]:
    """Admit what the tenant's free slots and its runs' keys allow; the admitted runs' wakeups."""
    rows = [r for r in store.runs.values() if r.tenant_id == tenant_id]
    free = slots - sum(1 for r in rows if r.admitted and r.snapshot.status not in TERMINAL)
    queued = sorted((r for r in rows if not r.admitted and r.snapshot.status is QUEUED_STATUS),
                    key=lambda r: (-(r.snapshot.priority + (now - r.snapshot.created_at) / aging_seconds),
                                   r.snapshot.created_at))
    woken: list[Message] = []
    for row in queued:
        if len(woken) >= free:
            break
        key = row.key
        if key is not None and not row.key_held and store.key_holders(tenant_id, key.key) >= key.limit:
            continue
        run = row.snapshot
        store.admit(run.run_id)
        woken.append(effects.wake_message_of(tenant_id=tenant_id, run_id=run.run_id, revision=run.revision,
                                             partition=row.partition, reason="admitted", producer=PRODUCER,
                                             cause=f"admission:{tenant_id}"))
    return woken
