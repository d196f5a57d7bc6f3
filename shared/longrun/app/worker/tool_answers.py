"""What a call's answer does to the run: confirmed (with its receipt), failed, unavailable (a retry
on a durable timer, or a wait for the far side's health), or unknown (the run parks for the
reconciler)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from longrun.app.worker.commit import Step, ToolRequest
from longrun.app.worker.far_side import FarSide, type_names
from longrun.artifacts import INLINE_LIMIT
from longrun.authoring import ToolResult
from longrun.domain import (RECEIPT_FACT_PREFIX, ActionStatus, EffectKind, RunStatus, ScheduleRetry, Wait, freeze,
                            retryable, wait_for)
from longrun.domain import events as ev
from longrun.domain.breaker import BreakerState, health_wait
from longrun.ports.runs import Artifact, StoredRun, defer

logger = logging.getLogger("longrun.app.worker")

RECORDED_WITH_THE_ANSWER = frozenset({EffectKind.PURE, EffectKind.READ})
"""Effect kinds whose first call is recorded (prepared, submitted, charged, confirmed) in one
transaction after it answered: calling them again after a crash is harmless by definition, so
nothing has to be on record before the call (and no durable timer watches it: a worker that dies
mid-call lets its run lease expire, and the run is taken over and the call made again). Writes, and
calls that declare ``heartbeat_timeout``, keep the two-phase record."""


async def receipt_of(far: FarSide, result: ToolResult, tenant_id: str) -> tuple[dict[str, Any], str | None, int]:
    """The receipt the run keeps (inline, or a reference to the original uploaded under the tenant's
    prefix: a claim check, whatever the tool returned), its reference and size."""
    receipt, ref = dict(result.receipt), None
    body = json.dumps(receipt, sort_keys=True).encode()
    if len(body) > INLINE_LIMIT:
        # Upload first; the reference commits with the confirmation.
        ref = await far.artifacts.put(tenant_id, body)
        receipt = {"artifact": ref, "size": len(body), "external_id": result.external_id}
    return receipt, ref, len(body)


def answer_columns(result: ToolResult, receipt: dict[str, Any], ref: str | None) -> dict[str, Any]:
    """The ledger columns of a confirmed call."""
    return {"external_id": result.external_id, "receipt": dict(result.receipt) if ref is None else receipt,
            "receipt_ref": ref}


async def confirm(far: FarSide, step: Step, stored: StoredRun, call: ToolRequest,
                  result: ToolResult) -> StoredRun | None:
    """A call on record before it ran answered: confirmed, its receipt a fact."""
    receipt, ref, size = await receipt_of(far, result, stored.snapshot.tenant_id)

    def confirmation(s: StoredRun) -> list[ev.RunEvent]:
        return [step.event(s, ev.ActionConfirmed, logical_action=call.logical_action,
                           external_id=result.external_id, receipt_ref=ref),
                step.event(s, ev.FactRecorded, offset=2, key=f"{RECEIPT_FACT_PREFIX}{call.logical_action}",
                           value=freeze(receipt), source=f"tool:{call.tool.name}")]

    return await step.record_outcome(stored, call.key, ActionStatus.CONFIRMED, confirmation,
                                     artifact=Artifact(ref, size, stored.snapshot.tenant_id) if ref else None,
                                     **answer_columns(result, receipt, ref))


async def confirm_with_request(far: FarSide, step: Step, stored: StoredRun, pending: list[ev.RunEvent],
                               call: ToolRequest, result: ToolResult) -> StoredRun:
    """Prepared, submitted, charged and confirmed as one event (``action.recorded``, with the
    receipt) in the run's next transaction. The step is written with the decision after it, unless
    that decision asks the world for more (a call: the round writes the step first), so a run's
    last step commits with its completion or wait. Losing a race to another writer (StaleRevision)
    records nothing: the step is decided again on the new state, and a pure or read call may
    simply run again."""
    prepared = pending[0]
    assert isinstance(prepared, ev.ActionPrepared)
    receipt, ref, size = await receipt_of(far, result, stored.snapshot.tenant_id)
    events = [step.event(stored, ev.ActionRecorded, **ev.request_of(prepared), external_id=result.external_id,
                         receipt_ref=ref, receipt=freeze(receipt))]
    answer = answer_columns(result, receipt, ref)
    if ref is None:
        return defer(stored, events, request=call.ledger(stored.snapshot.run_id, step.fence, answer))
    return await step.commit(stored, events, call=call, answer=answer,
                             artifact=Artifact(ref, size, stored.snapshot.tenant_id))


async def submitted(step: Step, stored: StoredRun, pending: list[ev.RunEvent], call: ToolRequest) -> StoredRun:
    """A call recorded with its answer got none: its submission goes on record first, as for a write."""
    if not pending:
        return stored
    return await step.commit(stored, pending, call=call)


def park_for_reconciliation(step: Step, stored: StoredRun, reason: str) -> list[ev.RunEvent]:
    """The move to ACTION_UNKNOWN after an ``action.unknown`` (at offset 1), while the run is still
    this step's. An operator may have cancelled or paused it meanwhile (the outcome is then
    recorded on the new state): it stays where it was, and cancelling waits for the reconciler."""
    if stored.snapshot.status is not RunStatus.RUNNING:
        return []
    return [step.event(stored, ev.RunStatusChanged, offset=2, to=RunStatus.ACTION_UNKNOWN, reason=reason)]


async def unknown(step: Step, stored: StoredRun, call: ToolRequest, cause: str, why: str | None, *,
                  last_error: str | None = None) -> StoredRun | None:
    """The far side may have acted (``cause``): the outcome is UNKNOWN, never asked again blindly; the
    run parks for the reconciler (``why``) unless an operator moved it meanwhile, or (``why`` None: a
    call of a fan-out) its join decides whether it parks."""
    fields = {} if last_error is None else {"last_error": last_error}
    return await step.record_outcome(stored, call.key, ActionStatus.UNKNOWN, lambda s: [
        step.event(s, ev.ActionUnknown, logical_action=call.logical_action, cause=cause),
        *(park_for_reconciliation(step, s, why) if why is not None else [])], **fields)


async def failed(step: Step, stored: StoredRun, call: ToolRequest, error: str) -> StoredRun | None:
    return await step.record_outcome(stored, call.key, ActionStatus.FAILED, lambda s: [
        step.event(s, ev.ActionFailed, logical_action=call.logical_action, error=error)], last_error=error)


@dataclass(frozen=True, slots=True)
class Retry:
    """What an unavailable call's retry policy and its far side's breaker say: try again after ``delay``
    seconds, or (``delay`` None) once the far side is healthy; or, with ``failure``, not at all."""

    delay: float | None
    failure: str | None


async def retry_of(far: FarSide, stored: StoredRun, call: ToolRequest, error: Exception, *, probe: bool,
                   cause: str) -> Retry:
    """The retry of a call that was unavailable (``cause``); the far side's breaker counts the failure.
    A probe tried the far side for every run waiting on it: its failure is charged to this run, but
    does not use up its attempts; the breaker says when it goes again."""
    tool = call.tool
    breaker = await far.breakers.failed(tool.health_key) if far.breakers is not None else None
    waits_for_health = breaker is not None and breaker.state is not BreakerState.CLOSED
    record = stored.snapshot.action(call.logical_action)
    assert record is not None
    policy = tool.retry or far.retry
    delay, failure = far.retry_delay(policy, record.attempts, error, cause)
    probed = probe and waits_for_health and retryable(policy, type_names(error))
    if delay is None and not probed:
        logger.info("run %s: %s unavailable: %s", stored.snapshot.run_id, tool.name, failure)
        return Retry(None, failure)
    logger.info("run %s: %s unavailable (%s); %s", stored.snapshot.run_id, tool.name, cause,
                "waits for it to be healthy" if waits_for_health else f"attempt {record.attempts + 1} in {delay}s")
    return Retry(None if waits_for_health else delay, None)


def retry_wait(far: FarSide, call: ToolRequest, retry: Retry) -> Wait:
    """The wait before ``call`` goes again: its retry's delay on a durable timer, or its far side's health."""
    ctx = far.context()
    if retry.delay is None:
        return health_wait(wait_id=ctx.new_id(), far_side=call.tool.health_key, logical_action=call.logical_action,
                           now=ctx.now, max_wait=far.health_max_wait)
    return wait_for(ScheduleRetry(logical_action=call.logical_action, delay=retry.delay), ctx)[1]


async def unavailable(far: FarSide, step: Step, stored: StoredRun, call: ToolRequest, error: Exception, *,
                      probe: bool, cause: str) -> StoredRun | None:
    """Definitely not applied, or a pure or read call that did not answer (``cause`` says which):
    the action is RETRYABLE, and its next attempt (charged) waits on a durable timer for the retry
    policy's delay, or, while the far side's breaker is open, until it is healthy again. Past the
    policy's attempts, or for an error it does not retry, the action FAILED, which the run kind's
    ``decide`` sees; a failed probe waits for the next one instead."""
    retry = await retry_of(far, stored, call, error, probe=probe, cause=cause)
    if retry.failure is not None:
        return await failed(step, stored, call, retry.failure)

    def retry_later(s: StoredRun) -> list[ev.RunEvent]:
        events = [step.event(s, ev.ActionUnavailable, logical_action=call.logical_action, cause=cause)]
        if s.snapshot.status is not RunStatus.RUNNING:  # an operator's pause or cancel keeps the run there
            return events
        wait = retry_wait(far, call, retry)
        return [*events, step.event(s, ev.WaitStarted, offset=2, status=RunStatus.RETRY_SCHEDULED, wait=wait)]

    return await step.record_outcome(stored, call.key, ActionStatus.RETRYABLE, retry_later, last_error=cause)


async def retry_later(step: Step, stored: StoredRun, call: ToolRequest, cause: str) -> StoredRun | None:
    """RETRYABLE, the run not parked: a call of a fan-out, whose join decides when it goes again."""
    return await step.record_outcome(stored, call.key, ActionStatus.RETRYABLE, lambda s: [
        step.event(s, ev.ActionUnavailable, logical_action=call.logical_action, cause=cause)], last_error=cause)
