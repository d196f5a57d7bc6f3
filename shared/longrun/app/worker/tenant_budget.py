"""A model call not worth making now: the run's tenant has spent its budget for the period, so the run
parks, uncharged, until the period rolls over (its wait's own timer) or an operator raises the budget
(the raise wakes it by its key, ``tenant_budget:<tenant>``)."""

from __future__ import annotations

from longrun.app.worker.commit import Step
from longrun.app.worker.far_side import FarSide
from longrun.domain import RunStatus
from longrun.domain import events as ev
from longrun.domain.tenant_limits import budget_wait, woken_by_budget
from longrun.ports.runs import StoredRun


async def parked(far: FarSide, step: Step, stored: StoredRun, purpose: str) -> bool:
    """Whether the run parked instead of asking the model for ``purpose``."""
    if far.spent_tenants is None:
        return False
    run = stored.snapshot
    # Woken by a raise: what this worker read before it may be older than the raise.
    until = await far.spent_tenants.spent_until(run.tenant_id, fresh=woken_by_budget(run.last_wake, run.tenant_id))
    ctx = far.context()
    if until is None or until <= ctx.now:
        return False
    wait = budget_wait(wait_id=ctx.new_id(), tenant_id=run.tenant_id, purpose=purpose, until=until)
    await step.finish(stored, ev.WaitStarted, status=RunStatus.RETRY_SCHEDULED, wait=wait)
    return True
