"""A decision's tool call, through the action ledger: prepared and submitted on record first (for
writes; pure and read calls are recorded with their answer), checked against the run's scope and
the far side's health, given a permit of its tenant's tool group (if one bounds it) for as long as
it is in flight, watched start to close and by its heartbeats, and its answer recorded."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry.trace import SpanKind

from longrun import otel
from longrun.app.worker import live, rate_limit, tool_permits
from longrun.app.worker import tool_answers as answers
from longrun.app.worker.calls import UNRECORDED, Call, Unrecorded, supervise
from longrun.app.worker.commit import Step, ToolRequest
from longrun.app.worker.far_side import FarSide, start_to_close
from longrun.app.worker.scope import refuse, scope_check
from longrun.app.worker.tool_permits import Permit
from longrun.authoring import RunKind, Tool, ToolResult
from longrun.domain import (
    ActionRecord,
    ActionStatus,
    CallTool,
    RecoveryPolicy,
    RunSnapshot,
    RunStatus,
    calls,
    idempotency_key,
    recovery_policy,
    thaw,
)
from longrun.domain import events as ev
from longrun.domain.breaker import Admission, health_wait
from longrun.errors import ActionOutcomeUnknown, LeaseLost, ToolRejected, ToolUnavailable
from longrun.ports.runs import StoredRun


@dataclass(frozen=True, slots=True)
class Admitted:
    """A call past its checks, to be made now: its request, the ledger's record of it (None: a first
    call, ``prepared`` then holds its ``action.prepared``), whether it probes its far side's health,
    and its tool permit (the run's, of the tool's group: released once the call, or every call of a
    fan-out, answered)."""

    call: ToolRequest
    args: dict[str, Any]
    record: ActionRecord | None
    prepared: tuple[ev.RunEvent, ...]
    probe: bool
    permit: Permit


async def call_tool(far: FarSide, step: Step, stored: StoredRun, kind: RunKind,
                    decision: CallTool) -> StoredRun | None:
    request = await requested(step, stored, kind, decision)
    if request is None:
        return None
    name, record = request.logical_action, stored.snapshot.action(decision.logical_action)
    if (record is not None and record.status is ActionStatus.SUBMITTED
            and recovery_policy(request.tool.effect) is RecoveryPolicy.RECONCILE):
        # A non-idempotent write that may have happened before a crash: never blind-retry it.
        return await answers.unknown(step, stored, request, "submitted before a crash; outcome not recorded",
                                     f"{name} needs reconciliation")
    if record is not None and record.status is not ActionStatus.SUBMITTED and record.status is not ActionStatus.RETRYABLE:
        await step.finish(stored, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION,
                          reason=f"decide asked again for {name}, already {record.status.value}")
        return None
    admitted = await admit(far, step, stored, kind, request, decision.approval_id)
    if admitted is None:
        return None
    try:
        return await _call(far, step, stored, admitted)
    finally:
        await admitted.permit.release()


async def requested(step: Step, stored: StoredRun, kind: RunKind, decision: CallTool) -> ToolRequest | None:
    """The request ``decision`` asks for, its arguments validated; None once arguments the tool refuses
    sent the run to a person."""
    tool = kind.tools[decision.tool]
    try:
        args = tool.validate(thaw(decision.args))
    except ToolRejected as e:
        await step.finish(stored, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION, reason=str(e))
        return None
    run, name = stored.snapshot, decision.logical_action
    record = run.action(name)
    key = record.idempotency_key if record else idempotency_key(run.run_id, name, attempt_scope=1)
    return ToolRequest(tool, name, key, args)


async def admit(far: FarSide, step: Step, stored: StoredRun, kind: RunKind, call: ToolRequest,
                approval_id: str | None) -> Admitted | None:
    """``call`` checked against the run's scope (a first call), its rate limits and its far side's
    health, holding its permit; None once the run was parked or sent to a person instead."""
    run, tool, name = stored.snapshot, call.tool, call.logical_action
    args = dict(call.args)
    record = run.action(name)
    prepared: tuple[ev.RunEvent, ...] = ()
    if record is None:
        requested_hash = call.request_hash
        if run.permissions is not None:
            # Before anything is prepared: a call outside the scope is refused, never retried.
            resource = tool.resource(args) if tool.resource is not None else None
            why, approval_id = await scope_check(step, run, kind, tool, name, resource, requested_hash, approval_id)
            if why is not None:
                await refuse(far, step, stored, kind, tool, name, resource, requested_hash, why)
                return None
        prepared = (step.event(stored, ev.ActionPrepared, logical_action=name, tool=tool.name,
                               tool_version=tool.version, effect_kind=tool.effect, idempotency_key=call.key,
                               approval_id=approval_id, request_hash=requested_hash),)
    if tool.rate_limits and await rate_limit.in_line(far, step, stored, tool.rate_limits, name,
                                                     record.attempts if record else 0) is None:
        return None
    probe = False
    if far.breakers is not None:
        admission = await far.breakers.admit(tool.health_key, run.run_id)
        if admission is Admission.WAIT:
            await _wait_for_health(far, step, stored, tool.health_key, name)
            return None
        probe = admission is Admission.PROBE
    permit = await tool_permits.take(far, step, stored, tool, name)
    if permit is None:
        return None
    return Admitted(call, args, record, prepared, probe, permit)


async def on_record(far: FarSide, step: Step, stored: StoredRun, admitted: Admitted,
                    events: list[ev.RunEvent]) -> StoredRun:
    """``admitted`` on record before it is made, watched by its durable timers: a first attempt
    submitted and charged (after ``events``), or the same submission sent again by a new lease holder."""
    call, record = admitted.call, admitted.record
    timers = _timers(step, stored.snapshot, call)
    if record is not None and record.status is not ActionStatus.RETRYABLE:
        await step.resend(stored, call, far.lease_ttl, timers)
        return stored
    # ``events`` take the seqs next on ``stored`` (a fan-out prepared them before its earlier calls' commits).
    events = [replace(e, seq=stored.seq(i)) for i, e in enumerate(events, 1)]
    return await step.commit(stored, [*events, *_submission(step, stored, call, offset=len(events))],
                             call=call, timers=timers)


async def attempt(far: FarSide, step: Step, run: RunSnapshot, admitted: Admitted, *, on_record: bool) -> ToolResult:
    """The request sent, watched (its start-to-close, its heartbeats, its live output); what it answered."""
    call = admitted.call
    tool, name, key = call.tool, call.logical_action, call.key
    step.crash_point("worker.before_tool_request")
    return await supervise(live.streamed(far, run, name, _traced_call(tool, name, admitted.args, key,
                                                                      step.fence.token)),
                           _watch(step, run, tool, name, key, on_record=on_record),
                           start_to_close=start_to_close(tool, run), heartbeat_timeout=tool.heartbeat_timeout)


async def _call(far: FarSide, step: Step, stored: StoredRun, admitted: Admitted) -> StoredRun | None:
    """The call made and its outcome recorded: on record first (a write, or a watched call), watched
    while it runs."""
    run = stored.snapshot
    call, record, probe = admitted.call, admitted.record, admitted.probe
    tool, name = call.tool, call.logical_action
    # A SUBMITTED pure, read or idempotent action re-runs under the same key after a crash: the
    # same submission, charged when it was first made.
    pending: list[ev.RunEvent] = []
    if record is None and tool.effect in answers.RECORDED_WITH_THE_ANSWER and tool.heartbeat_timeout is None:
        pending = [*admitted.prepared, *_submission(step, stored, call, offset=1)]
    else:
        stored = await on_record(far, step, stored, admitted, list(admitted.prepared))
    try:
        result = await attempt(far, step, run, admitted, on_record=not pending)
    except (ActionOutcomeUnknown, TimeoutError) as e:
        stored = await answers.submitted(step, stored, pending, call)
        cause = str(e) or type(e).__name__
        if tool.effect in answers.RECORDED_WITH_THE_ANSWER:
            # Asking a pure or read tool again changes nothing: no answer is retried, not reconciled.
            return await answers.unavailable(far, step, stored, call, e, probe=probe, cause=cause)
        return await answers.unknown(step, stored, call, cause, f"{name}: outcome unknown ({cause})",
                                     last_error=cause)
    except ToolUnavailable as e:
        stored = await answers.submitted(step, stored, pending, call)
        return await answers.unavailable(far, step, stored, call, e, probe=probe, cause=str(e))
    except ToolRejected as e:
        stored = await answers.submitted(step, stored, pending, call)
        await healthy(far, tool, probe=probe)
        return await answers.failed(step, stored, call, str(e))
    step.crash_point("worker.after_tool_response_before_record")
    await healthy(far, tool, probe=probe)
    if pending:
        return await answers.confirm_with_request(far, step, stored, pending, call, result)
    return await answers.confirm(far, step, stored, call, result)


def _submission(step: Step, stored: StoredRun, call: ToolRequest, *, offset: int) -> list[ev.RunEvent]:
    """A first attempt's (or a retry's) ``action.submitted`` and its charge, after ``offset`` events."""
    return [step.event(stored, ev.ActionSubmitted, offset=offset + 1, logical_action=call.logical_action),
            step.event(stored, ev.BudgetCharged, offset=offset + 2, tool_calls=1)]


def _timers(step: Step, run: RunSnapshot, call: ToolRequest) -> tuple[dict[str, Any], ...]:
    """A call on record before it runs is watched by durable timers, scheduled with that record."""
    return calls.call_timers(run.run_id, call.logical_action, token=step.fence.token,
                             start_to_close=start_to_close(call.tool, run), heartbeat_timeout=call.tool.heartbeat_timeout)


def _watch(step: Step, run: RunSnapshot, tool: Tool, name: str, key: str, *, on_record: bool) -> Call | Unrecorded:
    """What the call's heartbeats report to: written to its ledger row (moving its heartbeat timer)
    when it is on record, at most every third of its heartbeat timeout (or of start-to-close)."""
    if not on_record:
        return UNRECORDED
    limit = tool.heartbeat_timeout or start_to_close(tool, run)
    timer = (None if tool.heartbeat_timeout is None
             else calls.call_timer_key(run.run_id, name, step.fence.token, calls.HEARTBEAT))
    due_in = limit + calls.grace(limit)

    async def record(details: Mapping[str, Any] | None) -> bool:
        return await step.store.beat(key, step.fence.token, details, timer_key=timer, due_in=due_in)

    return Call(record=record, interval=limit / 3, refused=LeaseLost(run.run_id, step.fence.token))


async def _wait_for_health(far: FarSide, step: Step, stored: StoredRun, far_side: str, logical_action: str) -> None:
    """Not worth calling now: wait, uncharged, until ``far_side`` is healthy (or its probe is this run's)."""
    ctx = far.context()
    wait = health_wait(wait_id=ctx.new_id(), far_side=far_side, logical_action=logical_action, now=ctx.now,
                       max_wait=far.health_max_wait)
    await step.finish(stored, ev.WaitStarted, status=RunStatus.RETRY_SCHEDULED, wait=wait)


async def healthy(far: FarSide, tool: Tool, *, probe: bool) -> None:
    """The far side answered: its breaker closes (written only for a probe, or if anything was counted)."""
    if far.breakers is not None:
        await far.breakers.succeeded(tool.health_key, probe=probe)


async def _traced_call(tool: Tool, logical_action: str, args: dict[str, Any], key: str, token: int) -> ToolResult:
    """A tool call, in its span (GenAI's ``execute_tool``) when spans are exported."""
    if not otel.exporting():
        return await tool.execute(args, key, token)
    with otel.tracer.start_as_current_span(f"execute_tool {tool.name}", kind=SpanKind.CLIENT, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool.name,
            "longrun.tool.version": tool.version, "longrun.tool.effect": tool.effect.value,
            "longrun.logical_action": logical_action, "longrun.idempotency_key": key,
            "longrun.fencing_token": token}):
        return await tool.execute(args, key, token)
