"""Cancellation as a protocol: no new action starts; an action in doubt is settled first (by the
reconciler, which wakes the run again: cancelling cannot decide whether an effect happened);
declared compensations run one by one, newest first; then CANCELLED, or TIMED_OUT for a run
cancelling for its business deadline (``cancel_end``)."""

from __future__ import annotations

from longrun.app.worker.commit import Step
from longrun.authoring import Registry, Tool
from longrun.domain import RECEIPT_FACT_PREFIX, UNRECONCILED, ActionStatus, cancel_end, freeze, thaw
from longrun.domain import events as ev
from longrun.ports.runs import StoredRun


async def cancel(step: Step, stored: StoredRun, kinds: Registry) -> StoredRun | None:
    run = stored.snapshot
    kind = kinds.get(run.kind, run.versions.workflow)
    for action in run.actions:
        if action.status is ActionStatus.SUBMITTED:
            return await step.record_outcome(stored, action.idempotency_key, ActionStatus.UNKNOWN,
                                             lambda s, a=action: [step.event(
                                                 s, ev.ActionUnknown, logical_action=a.logical_action,
                                                 cause="cancelled while submitted; outcome not recorded")],
                                             release=True)
        if action.status in UNRECONCILED:
            await step.commit(stored, [], release=True)
            return None
        if action.status is ActionStatus.COMPENSATING:
            return await _compensate(step, stored, kind.tools[action.tool], action.logical_action)
    for action in reversed(run.actions):
        tool = kind.tools.get(action.tool)
        if action.status is ActionStatus.CONFIRMED and tool is not None and tool.compensate is not None:
            stored = await step.commit(stored, [step.event(stored, ev.CompensationStarted,
                                                           logical_action=action.logical_action)])
            return await _compensate(step, stored, tool, action.logical_action)
    end, reason = cancel_end(run)
    await step.finish(stored, ev.RunStatusChanged, to=end, reason=reason)
    return None


async def _compensate(step: Step, stored: StoredRun, tool: Tool, logical_action: str) -> StoredRun | None:
    """Compensations must be idempotent: a crash mid-way runs this one again."""
    assert tool.compensate is not None
    receipt = stored.snapshot.fact(f"{RECEIPT_FACT_PREFIX}{logical_action}")
    result = await tool.compensate(thaw(receipt.value) if receipt else {})
    record = stored.snapshot.action(logical_action)
    assert record is not None
    return await step.record_outcome(stored, record.idempotency_key, ActionStatus.COMPENSATED, lambda s: [
        step.event(s, ev.ActionCompensated, logical_action=logical_action),
        step.event(s, ev.FactRecorded, offset=2, key=f"compensation:{logical_action}",
                   value=freeze(dict(result.receipt)), source=f"tool:{tool.name}")])
