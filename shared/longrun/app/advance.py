"""The worker's use case: advance one run under a lease, one decision at a time.

A wakeup only takes the lease (in the consumer's transaction, so the delivery is acked
at once); the step loop then runs outside any delivery. Each round re-reads the run,
lets the workflow's pure ``decide`` choose, carries the decision out (model call, tool
call through the action ledger, wait, completion) and commits the resulting events
with the expected revision AND the fencing token: a worker that lost its lease
changes nothing. Deterministic checks (terminal, paused, cancelling, waiting, budget)
come before any model call. A run leaves the worker by parking (wait, unknown
action), finishing, or losing its lease.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun import faults
from longrun.app import effects, webhooks
from longrun.artifacts import INLINE_LIMIT, ArtifactStore, register
from longrun.authoring import Registry, RunKind, Tool, ToolResult
from longrun.bus.consumer import Outcome
from longrun.db import actions as ledger
from longrun.db import runs
from longrun.db.errors import is_transient
from longrun.db.runs import Fence, StoredRun
from longrun.domain import (
    TERMINAL,
    ActionStatus,
    AskModel,
    CallTool,
    Complete,
    DecisionContext,
    Fail,
    RecoveryPolicy,
    Reconcile,
    RunStatus,
    ScheduleRetry,
    WaitForEvent,
    WaitForUser,
    build_resume_context,
    compact,
    exhausted,
    freeze,
    idempotency_key,
    recovery_policy,
    request_hash,
    thaw,
    to_plain,
    wait_for,
)
from longrun.domain import events as ev
from longrun.envelope import Envelope
from longrun.errors import ActionOutcomeUnknown, LeaseLost, ToolRejected, ToolUnavailable
from longrun.model import ModelAdapter, validate_proposal

logger = logging.getLogger(__name__)
PRODUCER = "worker"
PARKED = frozenset({RunStatus.WAITING_EVENT, RunStatus.WAITING_USER, RunStatus.RETRY_SCHEDULED,
                    RunStatus.ACTION_UNKNOWN, RunStatus.PAUSED, RunStatus.NEEDS_ATTENTION})
UNAVAILABLE_RETRY_DELAY = 2.0
MODEL_CONTEXT_ITEMS = 40


class Advancer:
    def __init__(self, *, engine: AsyncEngine, kinds: Registry, model: ModelAdapter, artifacts: ArtifactStore,
                 instance_id: str, lease_ttl: float, concurrency: int = 64, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None) -> None:
        self.engine = engine
        self.artifacts = artifacts
        self.kinds = kinds
        self.model = model
        self.instance_id = instance_id
        self.lease_ttl = lease_ttl
        self.clock = clock
        self.rng = rng or random.Random()
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()

    # -- bus side -----------------------------------------------------------------------
    async def on_wakeup(self, conn: AsyncConnection, envelope: Envelope) -> dict[str, Any]:
        """Consumer handler: take the lease in the inbox transaction; the step runs after the ack."""
        assert envelope.run_id is not None
        fence = await runs.take_lease(conn, envelope.run_id, self.instance_id, self.lease_ttl)
        if fence is None:
            return {"taken": False, "reason": "another worker holds the lease"}
        return {"taken": True, "owner": fence.owner, "token": fence.token}

    async def after_ack(self, outcome: Outcome) -> None:
        if outcome.duplicate or not outcome.outcome.get("taken"):
            return
        run_id = outcome.envelope.run_id
        assert run_id is not None
        self.start(run_id, Fence(outcome.outcome["owner"], outcome.outcome["token"]))

    def start(self, run_id: str, fence: Fence) -> None:
        task = asyncio.create_task(self.advance(run_id, fence), name=f"advance {run_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """On shutdown: stop stepping; leases expire or are released, and the runs move on elsewhere."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- the step loop --------------------------------------------------------------------
    async def advance(self, run_id: str, fence: Fence) -> None:
        async with self._slots:
            heartbeat = asyncio.create_task(self._heartbeat(run_id, fence))
            try:
                while await self._round(run_id, fence):
                    pass
            except LeaseLost:
                logger.warning("run %s: lease %d lost; another worker owns it now", run_id, fence.token)
            except Exception as e:
                if not is_transient(e):
                    logger.exception("run %s: step failed; the lease will expire and the run be retried", run_id)
                else:
                    logger.warning("run %s: database unavailable (%r); lease left to expire", run_id, e)
            finally:
                heartbeat.cancel()

    async def _heartbeat(self, run_id: str, fence: Fence) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            try:
                async with self.engine.begin() as conn:
                    if not await runs.extend_lease(conn, run_id, fence, self.lease_ttl):
                        return
            except Exception as e:
                logger.warning("run %s: heartbeat failed (%r)", run_id, e)

    async def _round(self, run_id: str, fence: Fence) -> bool:
        """One decision; True while the run wants another round in this worker."""
        async with self.engine.connect() as conn:
            stored = await runs.load(conn, run_id)
        if stored is None or stored.lease_owner != fence.owner or stored.fencing_token != fence.token:
            return False
        run = stored.snapshot
        if run.status in TERMINAL or run.status in PARKED:
            await self._commit(stored, [], fence, release=True)
            return False
        if run.status is RunStatus.READY:
            await self._commit(stored, [self._event(stored, ev.RunStatusChanged, to=RunStatus.RUNNING,
                                                    reason=f"taken by {fence.owner}")], fence)
            return True
        if run.status is RunStatus.CANCELLING:
            await self._commit(stored, [self._event(stored, ev.RunStatusChanged, to=RunStatus.CANCELLED,
                                                    reason="cancel requested; no action in flight")],
                               fence, release=True)
            return False
        spent = exhausted(run.budget)
        if spent is not None:
            await self._commit(stored, [self._event(stored, ev.RunStatusChanged, to=RunStatus.BUDGET_EXHAUSTED,
                                                    reason=f"budget {spent} exhausted")], fence, release=True)
            return False
        kind = self.kinds.get(run.kind, run.versions.workflow)
        ctx = DecisionContext(now=self.clock(), new_id=lambda: str(uuid.uuid4()), rng=self.rng)
        decision = kind.workflow.decide(run, ctx)
        if isinstance(decision, AskModel):
            return await self._ask_model(stored, fence, kind, decision)
        if isinstance(decision, CallTool):
            return await self._call_tool(stored, fence, kind, decision)
        if isinstance(decision, (WaitForEvent, WaitForUser, ScheduleRetry)):
            status, wait = wait_for(decision, ctx)
            await self._commit(stored, [self._event(stored, ev.WaitStarted, status=status, wait=wait)], fence,
                               release=True)
            return False
        if isinstance(decision, Complete):
            unmet = kind.workflow.accept(run, decision.evidence)
            if unmet:
                event = self._event(stored, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION,
                                    reason="acceptance check failed: " + "; ".join(unmet))
            else:
                event = self._event(stored, ev.RunCompleted, evidence=decision.evidence)
            await self._commit(stored, [event], fence, release=True)
            return False
        if isinstance(decision, Fail):
            await self._commit(stored, [self._event(stored, ev.RunStatusChanged, to=RunStatus.FAILED,
                                                    reason=decision.reason)], fence, release=True)
            return False
        assert isinstance(decision, Reconcile)
        await self._commit(stored, [self._event(stored, ev.RunStatusChanged, to=RunStatus.ACTION_UNKNOWN,
                                                reason=f"{decision.logical_action} needs reconciliation")],
                           fence, release=True)
        return False

    async def _ask_model(self, stored: StoredRun, fence: Fence, kind: RunKind, decision: AskModel) -> bool:
        run = stored.snapshot
        allowed = tuple(kind.allowed_actions(run, decision.purpose))
        context = dict(to_plain(compact(build_resume_context(run), MODEL_CONTEXT_ITEMS)))
        context["run_stage"], context["stage"] = context.get("stage"), decision.purpose
        context["stage_attempt"] = sum(1 for f in run.facts if f.key.startswith(f"proposal:{decision.purpose}:"))
        proposal = validate_proposal(await self.model.propose(context=context, allowed_actions=allowed), allowed)
        key = f"proposal:{decision.purpose}:{context['stage_attempt'] + 1}"
        await self._commit(stored, [
            self._event(stored, ev.BudgetCharged, model_calls=1, cost=proposal.usage.cost_usd),
            self._event(stored, ev.FactRecorded, offset=2, key=key, source="agent",
                        value=freeze({"action": proposal.action, "args": dict(proposal.args),
                                      "rationale": proposal.rationale})),
        ], fence)
        return True

    async def _call_tool(self, stored: StoredRun, fence: Fence, kind: RunKind, decision: CallTool) -> bool:
        run = stored.snapshot
        tool = kind.tools[decision.tool]
        try:
            args = tool.validate(thaw(decision.args))
        except ToolRejected as e:
            await self._commit(stored, [self._event(stored, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION,
                                                    reason=str(e))], fence, release=True)
            return False
        record = run.action(decision.logical_action)
        key = record.idempotency_key if record else idempotency_key(run.run_id, decision.logical_action,
                                                                      attempt_scope=1)
        if record is None:
            prepared = self._event(stored, ev.ActionPrepared, logical_action=decision.logical_action,
                                   tool=tool.name, tool_version=tool.version, effect_kind=tool.effect,
                                   idempotency_key=key, approval_id=decision.approval_id,
                                   request_hash=request_hash(tool.name, tool.version, args=args))
            events: list[ev.RunEvent] = [prepared]
        elif record.status is ActionStatus.SUBMITTED and recovery_policy(tool.effect) is RecoveryPolicy.RECONCILE:
            # A non-idempotent write that may have happened before a crash: never blind-retry it.
            await self._commit(stored, [
                self._event(stored, ev.ActionUnknown, logical_action=decision.logical_action,
                            cause="submitted before a crash; outcome not recorded"),
                self._event(stored, ev.RunStatusChanged, offset=2, to=RunStatus.ACTION_UNKNOWN,
                            reason=f"{decision.logical_action} needs reconciliation"),
            ], fence, release=True)
            return False
        elif record.status is ActionStatus.SUBMITTED:
            # Pure, read and idempotent writes re-run under the same key after a crash.
            events = []
        elif record.status is not ActionStatus.RETRYABLE:
            reason = f"decide asked again for {decision.logical_action}, already {record.status.value}"
            await self._commit(stored, [self._event(stored, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION,
                                                    reason=reason)], fence, release=True)
            return False
        else:
            events = [self._event(stored, ev.ActionSubmitted, logical_action=decision.logical_action)]
        if record is None:
            events.append(self._event(stored, ev.ActionSubmitted, offset=2, logical_action=decision.logical_action))
        events.append(self._event(stored, ev.BudgetCharged, offset=len(events) + 1, tool_calls=1))
        stored = await self._commit(stored, events, fence, ledger_row=(tool, decision.logical_action, key, args))
        faults.crash_point("worker.before_tool_request")
        try:
            result = await asyncio.wait_for(tool.execute(args, key, fence.token), timeout=tool.timeout)
        except (ActionOutcomeUnknown, TimeoutError) as e:
            cause = str(e) or f"no answer within {tool.timeout}s"
            await self._record_outcome(stored, fence, decision.logical_action, key, ActionStatus.UNKNOWN, [
                self._event(stored, ev.ActionUnknown, logical_action=decision.logical_action, cause=cause),
                self._event(stored, ev.RunStatusChanged, offset=2, to=RunStatus.ACTION_UNKNOWN,
                            reason=f"{decision.logical_action}: outcome unknown ({cause})"),
            ], last_error=cause)
            return False
        except ToolUnavailable as e:
            # Definitely not applied: retry the same submission later through a timer.
            retry = ScheduleRetry(logical_action=decision.logical_action, delay=UNAVAILABLE_RETRY_DELAY)
            ctx = DecisionContext(now=self.clock(), new_id=lambda: str(uuid.uuid4()), rng=self.rng)
            status, wait = wait_for(retry, ctx)
            await self._commit(stored, [self._event(stored, ev.WaitStarted, status=status, wait=wait)], fence,
                               release=True)
            logger.info("run %s: %s unavailable (%s); retry scheduled", run.run_id, tool.name, e)
            return False
        except ToolRejected as e:
            await self._record_outcome(stored, fence, decision.logical_action, key, ActionStatus.FAILED, [
                self._event(stored, ev.ActionFailed, logical_action=decision.logical_action, error=str(e)),
            ], last_error=str(e))
            return True
        faults.crash_point("worker.after_tool_response_before_record")
        await self._confirm(stored, fence, tool, decision.logical_action, key, result)
        return True

    async def _confirm(self, stored: StoredRun, fence: Fence, tool: Tool, logical_action: str, key: str,
                       result: ToolResult) -> None:
        receipt, ref = dict(result.receipt), None
        body = json.dumps(receipt, sort_keys=True).encode()
        if len(body) > INLINE_LIMIT:
            # Upload first; the reference commits with the confirmation below.
            ref = await self.artifacts.put(body)
            receipt = {"artifact": ref, "size": len(body), "external_id": result.external_id}
        await self._record_outcome(stored, fence, logical_action, key, ActionStatus.CONFIRMED, [
            self._event(stored, ev.ActionConfirmed, logical_action=logical_action, external_id=result.external_id,
                        receipt_ref=ref),
            self._event(stored, ev.FactRecorded, offset=2, key=f"receipt:{logical_action}",
                        value=freeze(receipt), source=f"tool:{tool.name}"),
        ], artifact=(ref, len(body)) if ref else None, external_id=result.external_id,
            receipt=dict(result.receipt) if ref is None else receipt, receipt_ref=ref)

    async def _record_outcome(self, stored: StoredRun, fence: Fence, logical_action: str, key: str,
                              status: ActionStatus, events: Sequence[ev.RunEvent], *,
                              artifact: tuple[str, int] | None = None, **fields: Any) -> None:
        parked = any(isinstance(e, ev.RunStatusChanged) for e in events)
        async with self.engine.begin() as conn:
            if artifact is not None:
                await register(conn, self.artifacts, artifact[0], size=artifact[1], media_type="application/json",
                               run_id=stored.snapshot.run_id)
            after = await runs.append(conn, stored, events, fence=fence, release_lease=parked)
            await ledger.record(conn, key, status, **fields)
            await effects.broadcast(conn, stored.snapshot, after, events, producer=PRODUCER)

    async def _commit(self, stored: StoredRun, events: Sequence[ev.RunEvent], fence: Fence, *,
                      release: bool = False,
                      ledger_row: tuple[Tool, str, str, dict[str, Any]] | None = None) -> StoredRun:
        async with self.engine.begin() as conn:
            if not events:
                await runs.release_lease(conn, stored.snapshot.run_id, fence)
                return stored
            after = await runs.append(conn, stored, events, fence=fence, release_lease=release)
            if ledger_row is not None:
                tool, logical_action, key, args = ledger_row
                await ledger.prepare(conn, action_id=str(uuid.uuid4()), run_id=stored.snapshot.run_id,
                                     logical_action=logical_action, tool=tool.name, tool_version=tool.version,
                                     effect_kind=tool.effect.value, idempotency_key=key,
                                     request_hash=request_hash(tool.name, tool.version, args=args),
                                     request=args, fencing_token=fence.token)
            await effects.broadcast(conn, stored.snapshot, after, events, producer=PRODUCER)
            if release:
                await effects.schedule_wait_timers(conn, after.snapshot)
                after = await webhooks.match_kept(conn, after, clock=self.clock)
        faults.crash_point("worker.after_commit")
        return after

    def _event(self, stored: StoredRun, cls: type[ev.RunEvent], *, offset: int = 1, **fields: Any) -> ev.RunEvent:
        return cls(seq=stored.seq(offset), at=self.clock(), **fields)

