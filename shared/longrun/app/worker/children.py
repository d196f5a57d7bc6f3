"""Carrying out ``StartChildren`` and ``WaitForChildren`` (``domain.children``).

Starting children is one transaction: the parent's ``run.child_started`` events and each child created
through admission (``app.scheduler.admit.create_run``, as a run.create from the bus would be) and linked
to its parent. A worker killed before it commits created nothing; one killed after finds the children on
record (``decide`` reads them) and never starts them again. A child's idempotency key is
``child:<parent run id>:<name>`` and its run id derives from the same two, so a step written twice
(a stale lease's and a new one's) makes one child.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from longrun.app.scheduler.admit import create_run
from longrun.app.worker.commit import Step
from longrun.config.admission import AdmissionSettings
from longrun.config.declaration import declared_variable
from longrun.domain import Budget, DecisionContext, RunStatus, StartChildren, WaitForChildren, children, thaw
from longrun.domain import events as ev
from longrun.envelope import Envelope, decode
from longrun.errors import DomainError, ErrorCode
from longrun.ports.runs import StoredRun
from longrun.ports.stores import RunTransaction

PRODUCER = "worker"
CHILD_INPUT_BYTES = int(str(declared_variable(AdmissionSettings, "max_input_bytes").default))
"""A child's input is held to the largest a run.create may carry by default."""


class ChildRefused(DomainError):
    """Admission refused a child; nothing of the step was written."""

    code = ErrorCode.EVENT_REJECTED

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"child {name!r} refused: {reason}")


def child_run_id(parent_run_id: str, name: str) -> str:
    return f"run-{uuid.uuid5(uuid.NAMESPACE_URL, f'longrun:child:{parent_run_id}:{name}')}"


def _envelope(parent: StoredRun, event: ev.ChildStarted, decision_input: object, at: float) -> Envelope:
    run = parent.snapshot
    key = f"child:{run.run_id}:{event.name}"
    budget = event.budget
    payload = {"workflow": event.kind, "input": thaw(decision_input), "idempotency_key": key,
               "budget": {"model_calls": budget.model_calls, "tool_calls": budget.tool_calls, "cost_usd": budget.cost},
               "labels": {"parent_run_id": run.run_id, "child_name": event.name}}
    return decode(json.dumps({
        "event_id": key, "type": "run.create", "schema_version": 4, "producer": PRODUCER,
        "tenant_id": run.tenant_id, "correlation_id": key,
        "occurred_at": datetime.fromtimestamp(at, UTC).isoformat(), "payload": payload}).encode())


async def start_children(step: Step, stored: StoredRun, decision: StartChildren) -> StoredRun | None:
    """Record and create ``decision``'s children in one commit; the state to go on from (``decide`` is
    asked again), or None when the run went to a person instead (a name used before, a child refused)."""
    run = stored.snapshot
    again = [c.name for c in decision.children if children.outcome(run, c.name) is not None]
    if again:
        await step.finish(stored, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION,
                          reason=f"decide started children {', '.join(again)} again")
        return None
    budget, started = run.budget, []
    for offset, child in enumerate(decision.children, 1):
        drawn = children.draw(budget, child.budget)
        budget = Budget(budget.limit, budget.used + drawn)
        started.append(step.event(stored, ev.ChildStarted, offset=offset, name=child.name,
                                  child_run_id=child_run_id(run.run_id, child.name), kind=child.kind, budget=drawn))
    handover = step.handover
    if handover is None:
        raise ValueError("a worker that starts children needs the tenant slots and partitions (handover)")

    async def create(tx: RunTransaction) -> None:
        for child, event in zip(decision.children, started, strict=True):
            answered = await create_run(tx, _envelope(stored, event, child.input, event.at), kinds=step.kinds,
                                        partitions=handover.partitions, slots=handover.slots,
                                        max_input_bytes=CHILD_INPUT_BYTES, clock=step.clock,
                                        new_id=lambda: event.child_run_id)
            outcome = answered.outcome
            if outcome.get("rejected"):
                raise ChildRefused(child.name, str(outcome["reason"]))
            await tx.link_child(event.child_run_id, parent_run_id=run.run_id, name=child.name,
                                on_parent_cancel=child.on_parent_cancel.value)
        step.crash_point("worker.children_created")

    try:
        return await step.commit(stored, started, creates=create)
    except ChildRefused as e:
        await step.finish(stored, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION, reason=str(e))
        return None


async def wait_for_children(step: Step, stored: StoredRun, decision: WaitForChildren, ctx: DecisionContext) -> None:
    """Park the run, holding no slot, until enough of the children have ended; a wait that is satisfied
    already, or names a child never started, goes to a person instead."""
    run = stored.snapshot
    unknown = [name for name in decision.names if children.outcome(run, name) is None]
    count = children.needed(decision.names, decision.until)
    if unknown:
        reason = f"decide waits for children {', '.join(unknown)} it never started"
    elif children.satisfied(run, decision.names, count):
        reason = f"decide waits for children {', '.join(decision.names)} that ended already"
    else:
        status, wait = children.children_wait(ctx.new_id(), decision.names, count, decision.deadline)
        await step.finish(stored, ev.WaitStarted, status=status, wait=wait)
        return
    await step.finish(stored, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION, reason=reason)

