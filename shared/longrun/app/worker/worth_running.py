"""Worth running now, before a step: a run whose kind declares the far side its next call needs
(``RunKind.next_far_side``) parks while that far side's breaker holds calls back, before it decides
or asks a model anything, uncharged, giving its slot back (``domain.slots``) in the statement that
parks it. It is woken as any run waiting for a far side's health is, and queued again for a slot.

A kind that declares nothing pays one attribute test; one that does, a look at the worker's copy of
the breakers (``Breakers.view``): no statement unless the run parks.
"""

from __future__ import annotations

from longrun.app.worker.commit import Step
from longrun.app.worker.far_side import FarSide
from longrun.authoring import RunKind
from longrun.domain import RunStatus
from longrun.domain import events as ev
from longrun.domain.breaker import health_wait, holds_back
from longrun.ports.runs import StoredRun


async def parked_before_deciding(far: FarSide, step: Step, stored: StoredRun, kind: RunKind) -> bool:
    """Whether the run was parked for its declared far side's health (it left this worker)."""
    declared = kind.next_far_side
    if declared is None or far.breakers is None:
        return False
    run = stored.snapshot
    far_side = declared(run)
    if far_side is None:
        return False
    ctx = far.context()
    if not holds_back(far.breakers.view(far_side), caller=run.run_id, now=ctx.now):
        return False
    wait = health_wait(wait_id=ctx.new_id(), far_side=far_side, logical_action=None, now=ctx.now,
                       max_wait=far.health_max_wait)
    await step.finish(stored, ev.WaitStarted, status=RunStatus.RETRY_SCHEDULED, wait=wait)
    return True
