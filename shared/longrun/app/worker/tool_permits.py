"""A call of a tool its tenant bounds (``tool_concurrency``) takes a permit of the tool's group just
before it goes, and frees it once its outcome is recorded (``domain.tool_permits``).

A call that finds the group's permits all held does not go: its run parks, uncharged and giving its
tenant slot back, showing ``waiting_for: tool_concurrency:<group>``, until a freed permit wakes it
(one waiter per permit, the oldest run first) or, at the latest, ``FarSide.health_max_wait`` passes.
Woken, it is queued, admitted again and asks for a permit anew. A tool no group of its tenant bounds
costs nothing here: the tenants' bounds are a copy the worker reads at most once a second.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from longrun.app.worker.commit import Step
from longrun.app.worker.far_side import FarSide
from longrun.authoring import Tool
from longrun.domain import RunStatus
from longrun.domain import events as ev
from longrun.domain.tool_permits import bounded_group, permit_wait
from longrun.ports.runs import StoredRun
from longrun.ports.tool_permits import ToolPermits

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Permit:
    """A call's permit (``permits`` None: its tool is not bounded, and nothing is held)."""

    permits: ToolPermits | None
    tenant_id: str = ""
    group: str = ""
    run_id: str = ""
    holder: str = ""

    async def release(self) -> None:
        """Freed, waking the group's longest waiter. A release that fails leaves the permit to the
        reconciler, which frees it once this worker no longer holds the run's lease."""
        if self.permits is None:
            return
        try:
            await self.permits.release(self.tenant_id, self.group, self.run_id, self.holder)
        except Exception as e:
            logger.warning("freeing the permit of %s for run %s failed (%r); the reconciler frees it",
                           self.group, self.run_id, e)


UNBOUNDED = Permit(None)


async def take(far: FarSide, step: Step, stored: StoredRun, tool: Tool, logical_action: str) -> Permit | None:
    """The call's permit; None when its run was parked for one (the caller returns)."""
    if far.tool_permits is None:
        return UNBOUNDED
    run = stored.snapshot
    bounded = bounded_group(tool.name, await far.tool_permits.bounds(run.tenant_id))
    if bounded is None:
        return UNBOUNDED
    group, bound = bounded
    if await far.tool_permits.take(run.tenant_id, group, bound, run.run_id, step.fence.owner):
        return Permit(far.tool_permits, run.tenant_id, group, run.run_id, step.fence.owner)
    ctx = far.context()
    wait = permit_wait(wait_id=ctx.new_id(), group=group, logical_action=logical_action, now=ctx.now,
                       max_wait=far.health_max_wait)
    await step.finish(stored, ev.WaitStarted, status=RunStatus.RETRY_SCHEDULED, wait=wait)
    # A permit freed between the take and the park found no waiter to wake: this run looks once more.
    # The run is parked already: should the look fail, its own timer wakes it.
    try:
        await far.tool_permits.wake_if_free(run.tenant_id, group, bound, run.run_id)
    except Exception as e:
        logger.warning("looking for a free permit of %s for run %s failed (%r); its timer wakes it",
                       group, run.run_id, e)
    return None
