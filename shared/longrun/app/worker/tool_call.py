"""A decision's tool call, through the action ledger: prepared and submitted on record first (for
writes; pure and read calls are recorded with their answer), checked against the run's scope and
the far side's health, given a permit of its tenant's tool group (if one bounds it) for as long as
it is in flight, watched start to close and by its heartbeats, and its answer recorded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import SpanKind

from longrun import otel
from longrun.app.worker import live, rate_limit, tool_permits
from longrun.app.worker import tool_answers as answers
from longrun.app.worker.calls import UNRECORDED, Call, Unrecorded, supervise
from longrun.app.worker.commit import Step, ToolRequest
from longrun.app.worker.far_side import FarSide, start_to_close
from longrun.app.worker.scope import refuse, scope_check
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
    request_hash,
    thaw,
)
from longrun.domain import events as ev
from longrun.domain.breaker import Admission, health_wait
from longrun.errors import ActionOutcomeUnknown, LeaseLost, ToolRejected, ToolUnavailable
from longrun.ports.runs import StoredRun


async def call_tool(far: FarSide, step: Step, stored: StoredRun, kind: RunKind,
                    decision: CallTool) -> StoredRun | None:
    run = stored.snapshot
    tool = kind.tools[decision.tool]
    try:
        args = tool.validate(thaw(decision.args))
    except ToolRejected as e:
        await step.finish(stored, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION, reason=str(e))
        return None
    name = decision.logical_action
    record = run.action(name)
    key = record.idempotency_key if record else idempotency_key(run.run_id, name, attempt_scope=1)
    call = ToolRequest(tool, name, key, args)
    events: list[ev.RunEvent] = []
    if record is None:
        requested = request_hash(tool.name, tool.version, args=args)
        approval_id = decision.approval_id
        if run.permissions is not None:
            # Before anything is prepared: a call outside the scope is refused, never retried.
            resource = tool.resource(args) if tool.resource is not None else None
            why, approval_id = await scope_check(step, run, kind, tool, name, resource, requested,
                                                 decision.approval_id)
            if why is not None:
                await refuse(far, step, stored, kind, tool, name, resource, requested, why)
                return None
        events.append(step.event(stored, ev.ActionPrepared, logical_action=name, tool=tool.name,
                                 tool_version=tool.version, effect_kind=tool.effect, idempotency_key=key,
                                 approval_id=approval_id, request_hash=requested))
    elif record.status is ActionStatus.SUBMITTED and recovery_policy(tool.effect) is RecoveryPolicy.RECONCILE:
        # A non-idempotent write that may have happened before a crash: never blind-retry it.
        return await answers.unknown(step, stored, call, "submitted before a crash; outcome not recorded",
                                     f"{name} needs reconciliation")
    elif record.status is not ActionStatus.SUBMITTED and record.status is not ActionStatus.RETRYABLE:
        await step.finish(stored, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION,
                          reason=f"decide asked again for {name}, already {record.status.value}")
        return None
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
    try:
        return await _call(far, step, stored, call, args, events, record, probe=probe)
    finally:
        await permit.release()


async def _call(far: FarSide, step: Step, stored: StoredRun, call: ToolRequest, args: dict[str, Any],
                events: list[ev.RunEvent], record: ActionRecord | None, *, probe: bool) -> StoredRun | None:
    """The call made and its outcome recorded: on record first (a write, or a watched call), watched
    while it runs."""
    run = stored.snapshot
    tool, name, key = call.tool, call.logical_action, call.key
    # A SUBMITTED pure, read or idempotent action re-runs under the same key after a crash: the
    # same submission, charged when it was first made.
    pending: list[ev.RunEvent] = []
    limit = start_to_close(tool, run)

    def timers() -> tuple[dict[str, Any], ...]:
        """A call on record before it runs is watched by durable timers, scheduled with that record."""
        return calls.call_timers(run.run_id, name, token=step.fence.token, start_to_close=limit,
                                 heartbeat_timeout=tool.heartbeat_timeout)

    if record is None or record.status is ActionStatus.RETRYABLE:
        events.append(step.event(stored, ev.ActionSubmitted, offset=len(events) + 1, logical_action=name))
        events.append(step.event(stored, ev.BudgetCharged, offset=len(events) + 1, tool_calls=1))
        if record is None and tool.effect in answers.RECORDED_WITH_THE_ANSWER and tool.heartbeat_timeout is None:
            pending = events
        else:
            stored = await step.commit(stored, events, call=call, timers=timers())
    else:
        await step.resend(stored, call, far.lease_ttl, timers())
    step.crash_point("worker.before_tool_request")
    try:
        result = await supervise(live.streamed(far, run, name, _traced_call(tool, name, args, key, step.fence.token)),
                                 _watch(step, run, tool, name, key, on_record=not pending),
                                 start_to_close=limit, heartbeat_timeout=tool.heartbeat_timeout)
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
        await _healthy(far, tool, probe=probe)
        return await answers.failed(step, stored, call, str(e))
    step.crash_point("worker.after_tool_response_before_record")
    await _healthy(far, tool, probe=probe)
    if pending:
        return await answers.confirm_with_request(far, step, stored, pending, call, result)
    return await answers.confirm(far, step, stored, call, result)


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


async def _healthy(far: FarSide, tool: Tool, *, probe: bool) -> None:
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
