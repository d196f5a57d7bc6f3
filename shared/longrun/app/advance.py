"""The worker's use case: advance one run under a lease, one decision at a time.

A wakeup takes the lease and reads the run in the statement that records the wakeup in the
worker's inbox (so the delivery is acked at once); the step loop then runs outside any
delivery, from the run as taken. Each round lets the workflow's pure ``decide`` choose,
carries the decision out (model call, tool call through the action ledger, wait,
completion) and commits the resulting events with the expected revision AND the fencing
token: a worker that lost its lease changes nothing. What needs no call out is written
with the round after it (``runs.defer``): a READY run's move to RUNNING with its first
step, a pure or read step with the next decision, before that decision calls out or
together with it (the last step commits with the completion). Deterministic checks
(terminal, paused, cancelling, waiting, budget) come before any model call. A run leaves
the worker by parking (wait, unknown action), finishing, or losing its lease.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import replace
from typing import Any

from opentelemetry.trace import SpanKind
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun import faults, logs, metrics, otel
from longrun.app import effects, questions
from longrun.app.calls import UNRECORDED, Call, Unrecorded, supervise
from longrun.app.ports import Artifact, CrashPoints, LedgerKeyTaken, LedgerOutcome, WorkerStore
from longrun.app.tool_health import Breakers
from longrun.app.worker_store import PgWorkerStore
from longrun.artifacts import INLINE_LIMIT, ArtifactStore
from longrun.authoring import Registry, RunKind, Tool, ToolResult, pins_key
from longrun.bus.consumer import Outcome
from longrun.db import actions as ledger
from longrun.db import inbox, runs
from longrun.db.driver import Pool
from longrun.db.errors import is_transient
from longrun.domain import (
    ANSWER_FACT_PREFIX,
    APPROVAL_FACT_PREFIX,
    DENIED_FACT_PREFIX,
    RECEIPT_FACT_PREFIX,
    TERMINAL,
    UNRECONCILED,
    ActionStatus,
    AskModel,
    AskUser,
    CallTool,
    Complete,
    DecisionContext,
    EffectKind,
    Fail,
    RecoveryPolicy,
    Reconcile,
    RetryPolicy,
    RunSnapshot,
    RunStatus,
    ScheduleRetry,
    WaitForEvent,
    WaitForUser,
    build_resume_context,
    cancel_end,
    compact,
    effective_start_to_close,
    budget_needs,
    exhausted,
    refusal,
    revalidated,
    freeze,
    idempotency_key,
    next_delay,
    recovery_policy,
    request_hash,
    retryable,
    thaw,
    to_plain,
    wait_for,
)
from longrun.domain import calls
from longrun.domain import events as ev
from longrun.domain.breaker import Admission, BreakerState, health_wait
from longrun.envelope import Envelope
from longrun.errors import ActionOutcomeUnknown, DecodeError, LeaseLost, StaleRevision, ToolRejected, ToolUnavailable
from longrun.model import ModelAdapter, Proposal, validate_proposal
from longrun.ports.runs import Fence, StoredRun

logger = logging.getLogger(__name__)
PRODUCER = "worker"
PARKED = frozenset({RunStatus.WAITING_EVENT, RunStatus.WAITING_USER, RunStatus.RETRY_SCHEDULED,
                    RunStatus.ACTION_UNKNOWN, RunStatus.PAUSED, RunStatus.NEEDS_ATTENTION})
MODEL_RETRY_FACT_PREFIX = "model_retry:"
"""The model answered unavailable for the n-th ask of a purpose: the fact ``model_retry:<purpose>:<n>``
counts its attempts (what the retry policy reads, whichever worker asks next)."""
ADOPT_BATCH = 32
MODEL_CONTEXT_ITEMS = 40
RECORDED_WITH_THE_ANSWER = frozenset({EffectKind.PURE, EffectKind.READ})
"""Effect kinds whose first call is recorded (prepared, submitted, charged, confirmed) in one
transaction after it answered: calling them again after a crash is harmless by definition, so
nothing has to be on record before the call (and no durable timer watches it: a worker that dies
mid-call lets its run lease expire, and the run is taken over and the call made again). Writes, and
calls that declare ``heartbeat_timeout``, keep the two-phase record."""

SCOPE_APPROVAL_PREFIX = "scope:"
"""The approval a call outside the run's scope waits for is ``scope:<logical_action>``."""

_TAKEN: ContextVar[StoredRun | None] = ContextVar("longrun_taken_run", default=None)
"""The run as ``on_wakeup`` took it, for ``after_ack``: the consumer awaits both in one task, so
the step loop starts from it instead of reading the run again."""
_CAUSE: ContextVar[str | None] = ContextVar("longrun_cause", default=None)
"""The event id of the wakeup a step loop answers (its task's own value): what its broadcasts
name as their cause."""


def start_to_close(tool: Tool, run: RunSnapshot) -> float:
    """Seconds a call of ``tool`` for ``run`` may take, start to answer: what the worker watches and
    the call's durable timer is due after. The run's cap (``RunTimeouts.start_to_close``) may shorten
    the tool's limit, never lengthen it."""
    return effective_start_to_close(tool.start_to_close, run)


def _type_names(error: Exception) -> list[str]:
    """The names of ``error``'s class and its bases: what ``RetryPolicy.non_retryable_error_types`` lists."""
    return [cls.__name__ for cls in type(error).__mro__]


class Advancer:
    def __init__(self, *, store: WorkerStore, kinds: Registry, model: ModelAdapter, artifacts: ArtifactStore,
                 instance_id: str, lease_ttl: float, concurrency: int = 64, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, handover: effects.SlotHandover | None = None,
                 crash_points: CrashPoints = faults.crash_point, retry: RetryPolicy = RetryPolicy(),
                 breakers: Breakers | None = None, health_max_wait: float = 600.0) -> None:
        """``handover``: a run this worker finishes gives its tenant slot to the next queued run in
        the same statement (without it, admission is notified and does that). ``retry``: the policy
        of tools and models that declare none. ``breakers``: the far sides' health (without them,
        every far side is called whatever it answered before); a run waiting for one to be healthy
        looks again by itself after ``health_max_wait`` seconds."""
        self.store = store
        self.artifacts = artifacts
        self.crash_point = crash_points
        self.kinds = kinds
        self.model = model
        self.instance_id = instance_id
        self.lease_ttl = lease_ttl
        self.clock = clock
        self.rng = rng or random.Random()
        self.handover = handover
        self.retry = retry
        self.breakers = breakers
        self.health_max_wait = health_max_wait
        self.served = frozenset(kinds.serves())
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def on_postgres(cls, *, engine: AsyncEngine, statements: Pool, artifacts: ArtifactStore,
                    clock: Callable[[], float] = time.time, **options: Any) -> Advancer:
        """The runtime's worker: its store is PostgreSQL (``app.worker_store``)."""
        store = PgWorkerStore(engine=engine, statements=statements, artifacts=artifacts, clock=clock)
        return cls(store=store, artifacts=artifacts, clock=clock, **options)

    # -- bus side -----------------------------------------------------------------------
    async def on_wakeup(self, envelope: Envelope) -> Outcome:
        """Consumer handler (``OwnClaim``): the wakeup's inbox row and the take of the run's lease in one
        statement; the steps run after the ack, from the run as taken."""
        if envelope.run_id is None:
            raise DecodeError(f"a {envelope.type} on a worker's queue names no run to wake", b"")
        _TAKEN.set(None)
        handled, stored = await self.store.take_on_wakeup(
            inbox.Message(envelope.event_id, envelope.type, envelope.run_id), self.instance_id, self.lease_ttl,
            self.served)
        _TAKEN.set(stored)
        if stored is not None:
            metrics.TAKE_DELAY.observe(max(0.0, self.clock() - envelope.occurred_at.timestamp()))
        return Outcome(envelope, handled.outcome, handled.duplicate)

    async def after_ack(self, outcome: Outcome) -> None:
        taken = _TAKEN.get()
        _TAKEN.set(None)
        if outcome.duplicate or not outcome.outcome.get("taken"):
            return
        run_id = outcome.envelope.run_id
        assert run_id is not None
        fence = Fence(outcome.outcome["owner"], outcome.outcome["token"])
        if taken is not None and (taken.snapshot.run_id != run_id or taken.fencing_token != fence.token):
            taken = None
        self.start(run_id, fence, trace=outcome.envelope.trace, taken=taken, cause=outcome.envelope.event_id)

    async def adopt_waiting(self, limit: int = ADOPT_BATCH) -> int:
        """Take over runs waiting for a worker that runs them, if this is one, and advance them: their
        wakeup reached a worker that could not. Returns how many."""
        adopted = await self.store.adopt(self.instance_id, self.lease_ttl, self.served, limit)
        for stored in adopted:
            run = stored.snapshot
            metrics.RECOVERIES.labels("taken_over").inc()
            with logs.bound(run.run_id, run.tenant_id):
                logger.info("run %s: taken over (%s@%s)", run.run_id, run.kind, run.versions.workflow)
                self.start(run.run_id, Fence(self.instance_id, stored.fencing_token), taken=stored)
        return len(adopted)

    def start(self, run_id: str, fence: Fence, *, trace: str | None = None, taken: StoredRun | None = None,
              cause: str | None = None) -> None:
        task = asyncio.create_task(self.advance(run_id, fence, trace=trace, taken=taken, cause=cause),
                                   name=f"advance {run_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """On shutdown: stop stepping; leases expire or are released, and the runs move on elsewhere."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- the step loop --------------------------------------------------------------------
    async def advance(self, run_id: str, fence: Fence, *, trace: str | None = None,
                      taken: StoredRun | None = None, cause: str | None = None) -> None:
        _CAUSE.set(cause)
        # The lease was taken with the wakeup: keep it alive while the run waits for a free slot too.
        heartbeat = asyncio.create_task(self._heartbeat(run_id, fence))
        if self._slots.locked():
            taken = None  # it will wait for a slot: others may append meanwhile, so read it then
        try:
            async with self._slots:
                # A child of the run's root: the wakeup's consumer knew it (``otel.root``), else the take read it.
                run_root = otel.root() or (taken.trace_root if taken is not None else None)
                with otel.run_span("advance run", run_root, cause=trace, attributes={
                        "longrun.run_id": run_id, "longrun.fencing_token": fence.token}):
                    await self.run_steps(run_id, fence, taken)
        finally:
            heartbeat.cancel()

    async def run_steps(self, run_id: str, fence: Fence, taken: StoredRun | None = None) -> None:
        """Rounds until the run leaves this worker (parks, finishes, or the lease is lost); a failure
        is logged and leaves the lease to expire."""
        try:
            stored = taken if taken is not None else await self._load(run_id, fence)
            while stored is not None:
                started, kind = time.perf_counter(), stored.snapshot.kind
                try:
                    stored = await self._round(stored, fence)
                    metrics.step(kind).observe(time.perf_counter() - started)
                except StaleRevision:
                    # Someone appended meanwhile (a webhook, an operator): re-read and decide again.
                    stored = await self._load(run_id, fence)
        except LeaseLost:
            logger.warning("run %s: lease %d lost; another worker owns it now", run_id, fence.token)
        except Exception as e:
            if not is_transient(e):
                logger.exception("run %s: step failed; the lease will expire and the run be retried", run_id)
            else:
                logger.warning("run %s: database unavailable (%r); lease left to expire", run_id, e)

    async def _load(self, run_id: str, fence: Fence) -> StoredRun | None:
        stored = await self.store.load(run_id)
        if stored is None or stored.lease_owner != fence.owner or stored.fencing_token != fence.token:
            return None
        return stored

    async def _heartbeat(self, run_id: str, fence: Fence) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            try:
                if not await self.store.extend_lease(run_id, fence, self.lease_ttl):
                    return
            except Exception as e:
                logger.warning("run %s: heartbeat failed (%r)", run_id, e)

    async def _round(self, stored: StoredRun, fence: Fence) -> StoredRun | None:
        """One decision; the state to continue from, or None once the run left this worker."""
        run = stored.snapshot
        if run.status in TERMINAL or run.status in PARKED:
            await self._commit(stored, [], fence, release=True)
            return None
        if pins_key(run.kind, run.versions) not in self.served:
            # Migrated since it was taken, to a version this worker lacks: a worker that runs it takes it.
            logger.warning("run %s: %s@%s is not run here; handed over", run.run_id, run.kind, run.versions.workflow)
            await self.store.hand_over(run.run_id, fence)
            return None
        if run.status is RunStatus.READY:
            # Written with the round's own transition: one statement (and snapshot written) per run less.
            stored = runs.defer(stored, [self._event(stored, ev.RunStatusChanged, to=RunStatus.RUNNING,
                                                     reason=f"taken by {fence.owner}")])
            run = stored.snapshot
        if run.status is RunStatus.CANCELLING:
            return await self._cancel(stored, fence)
        doubtful = [a.logical_action for a in run.actions if a.status in UNRECONCILED]
        if doubtful:
            # What to do next depends on whether that effect happened (e.g. its outcome was recorded
            # while the run was paused): park until the reconciler settles it and wakes the run.
            return await self._finish(stored, fence, ev.RunStatusChanged, to=RunStatus.ACTION_UNKNOWN,
                                      reason=f"{', '.join(doubtful)} awaits reconciliation")
        kind = self.kinds.get(run.kind, run.versions.workflow)
        ctx = self._context()
        decision = kind.workflow.decide(run, ctx)
        spent = exhausted(run.budget, budget_needs(decision, run))
        if spent is not None:
            return await self._finish(stored, fence, ev.RunStatusChanged, to=RunStatus.BUDGET_EXHAUSTED,
                                      reason=f"budget {spent} exhausted")
        if isinstance(decision, (AskModel, CallTool)) and stored.unwritten_request is not None:
            # The step before is on record before anything more is asked of the world.
            stored = await self._commit(stored, [], fence)
        stored = self._with_patches(stored, ctx.taken)
        if isinstance(decision, AskModel):
            return await self._ask_model(stored, fence, kind, decision)
        if isinstance(decision, CallTool):
            return await self._call_tool(stored, fence, kind, decision)
        if isinstance(decision, (WaitForEvent, WaitForUser, ScheduleRetry)):
            status, wait = wait_for(decision, ctx)
            return await self._finish(stored, fence, ev.WaitStarted, status=status, wait=wait)
        if isinstance(decision, AskUser):
            return await self._ask_user(stored, fence, decision, ctx)
        if isinstance(decision, Complete):
            unmet = kind.workflow.accept(run, decision.evidence)
            if unmet:
                return await self._finish(stored, fence, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION,
                                          reason="acceptance check failed: " + "; ".join(unmet))
            self.crash_point("worker.before_completion")
            return await self._finish(stored, fence, ev.RunCompleted, evidence=decision.evidence)
        if isinstance(decision, Fail):
            return await self._finish(stored, fence, ev.RunStatusChanged, to=RunStatus.FAILED,
                                      reason=decision.reason)
        assert isinstance(decision, Reconcile)
        return await self._finish(stored, fence, ev.RunStatusChanged, to=RunStatus.ACTION_UNKNOWN,
                                  reason=f"{decision.logical_action} needs reconciliation")

    async def _cancel(self, stored: StoredRun, fence: Fence) -> StoredRun | None:
        """No new action starts; declared compensations run one by one; then CANCELLED, or TIMED_OUT
        for a run cancelling for its business deadline (``cancel_end``).

        An action whose outcome is unknown must be settled first (by the reconciler, which
        wakes the run again): cancelling cannot decide whether an effect happened.
        """
        run = stored.snapshot
        kind = self.kinds.get(run.kind, run.versions.workflow)
        for action in run.actions:
            if action.status is ActionStatus.SUBMITTED:
                return await self._record_outcome(stored, fence, action.idempotency_key, ActionStatus.UNKNOWN,
                                                  lambda s, a=action: [self._event(
                                                      s, ev.ActionUnknown, logical_action=a.logical_action,
                                                      cause="cancelled while submitted; outcome not recorded")],
                                                  release=True)
            if action.status in UNRECONCILED:
                await self._commit(stored, [], fence, release=True)
                return None
            if action.status is ActionStatus.COMPENSATING:
                return await self._compensate(stored, fence, kind.tools[action.tool], action.logical_action)
        for action in reversed(run.actions):
            tool = kind.tools.get(action.tool)
            if action.status is ActionStatus.CONFIRMED and tool is not None and tool.compensate is not None:
                stored = await self._commit(stored, [self._event(stored, ev.CompensationStarted,
                                                                 logical_action=action.logical_action)], fence)
                return await self._compensate(stored, fence, tool, action.logical_action)
        end, reason = cancel_end(run)
        return await self._finish(stored, fence, ev.RunStatusChanged, to=end, reason=reason)

    async def _compensate(self, stored: StoredRun, fence: Fence, tool: Tool, logical_action: str) -> StoredRun | None:
        """Compensations must be idempotent: a crash mid-way runs this one again."""
        assert tool.compensate is not None
        receipt = stored.snapshot.fact(f"{RECEIPT_FACT_PREFIX}{logical_action}")
        result = await tool.compensate(thaw(receipt.value) if receipt else {})
        record = stored.snapshot.action(logical_action)
        assert record is not None
        return await self._record_outcome(stored, fence, record.idempotency_key, ActionStatus.COMPENSATED, lambda s: [
            self._event(s, ev.ActionCompensated, logical_action=logical_action),
            self._event(s, ev.FactRecorded, offset=2, key=f"compensation:{logical_action}",
                        value=freeze(dict(result.receipt)), source=f"tool:{tool.name}")])

    async def _ask_user(self, stored: StoredRun, fence: Fence, decision: AskUser, ctx: DecisionContext) -> None:
        """The question and the wait for its answer, in one commit; a question that cannot be asked
        (its schema is not one, or its id was answered before) goes to a person instead."""
        name = decision.question_id
        problem = questions.schema_problem(decision.answer_schema)
        if problem is not None:
            reason = f"question {name!r}: its answer schema is not a JSON Schema (draft 2020-12): {problem}"
        elif stored.snapshot.fact(ANSWER_FACT_PREFIX + name) is not None:
            reason = f"decide asked question {name!r} again, answered already"
        else:
            status, wait = wait_for(decision, ctx)
            await self._commit(stored, [
                self._event(stored, ev.QuestionOpened, question_id=name, text=decision.text,
                            answer_schema=decision.answer_schema),
                self._event(stored, ev.WaitStarted, offset=2, status=status, wait=wait)], fence, release=True)
            return None
        return await self._finish(stored, fence, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION, reason=reason)

    async def _finish(self, stored: StoredRun, fence: Fence, cls: type[ev.RunEvent], **fields: Any) -> None:
        """Append one event that takes the run out of this worker, and release the lease with it."""
        await self._commit(stored, [self._event(stored, cls, **fields)], fence, release=True)

    def _context(self) -> DecisionContext:
        return DecisionContext(now=self.clock(), new_id=lambda: str(uuid.uuid4()), rng=self.rng)

    def _with_patches(self, stored: StoredRun, patches: Sequence[str]) -> StoredRun:
        """A ``run.patch_taken`` for each of ``patches`` the run had not taken, deferred: written with
        what the decision writes next, before its events, and never without them, so a replay takes
        the patched branch exactly where the run took it."""
        run = stored.snapshot
        new = [patch for patch in patches if patch not in run.patches]
        if not new:
            return stored
        return runs.defer(stored, [self._event(stored, ev.PatchTaken, offset=i, patch=patch,
                                               workflow_version=run.versions.workflow)
                                   for i, patch in enumerate(new, 1)])

    async def _ask_model(self, stored: StoredRun, fence: Fence, kind: RunKind, decision: AskModel) -> StoredRun:
        run = stored.snapshot
        allowed = tuple(kind.allowed_actions(run, decision.purpose))
        context = dict(to_plain(compact(build_resume_context(run), MODEL_CONTEXT_ITEMS)))
        context["run_stage"], context["stage"] = context.get("stage"), decision.purpose
        context["stage_attempt"] = sum(1 for f in run.facts if f.key.startswith(f"proposal:{decision.purpose}:"))
        try:
            answer = await _traced_propose(self.model, decision.purpose, context, allowed)
        except ToolUnavailable as e:
            return await self._model_unavailable(stored, fence, kind, decision.purpose, context["stage_attempt"] + 1, e)
        proposal = validate_proposal(answer, allowed)
        metrics.MODEL_TOKENS.labels(run.kind, "input").inc(proposal.usage.input_tokens)
        metrics.MODEL_TOKENS.labels(run.kind, "output").inc(proposal.usage.output_tokens)
        metrics.MODEL_COST.labels(run.kind).inc(proposal.usage.cost_usd)
        key = f"proposal:{decision.purpose}:{context['stage_attempt'] + 1}"
        return await self._commit(stored, [
            self._event(stored, ev.BudgetCharged, model_calls=1, cost=proposal.usage.cost_usd),
            self._event(stored, ev.FactRecorded, offset=2, key=key, source="agent",
                        value=freeze({"action": proposal.action, "args": dict(proposal.args),
                                      "rationale": proposal.rationale})),
        ], fence)

    async def _model_unavailable(self, stored: StoredRun, fence: Fence, kind: RunKind, purpose: str, ask: int,
                                 error: ToolUnavailable) -> None:
        """The model did not answer: the attempt is charged and counted (a fact, so any worker reads the
        count), and the run waits for the retry policy's delay; past its attempts, NEEDS_ATTENTION."""
        fact_key = f"{MODEL_RETRY_FACT_PREFIX}{purpose}:{ask}"
        previous = stored.snapshot.fact(fact_key)
        attempts = (thaw(previous.value)["attempts"] if previous is not None else 0) + 1  # type: ignore[index]
        delay, failure = self._retry_delay(kind.model_retry or self.retry, attempts, error, str(error))
        events = [self._event(stored, ev.BudgetCharged, model_calls=1),
                  self._event(stored, ev.FactRecorded, offset=2, key=fact_key, source="runtime",
                              value=freeze({"attempts": attempts, "error": str(error)}))]
        if delay is None:
            events.append(self._event(stored, ev.RunStatusChanged, offset=3, to=RunStatus.NEEDS_ATTENTION,
                                      reason=f"model for {purpose!r}: {failure}"))
        else:
            status, wait = wait_for(ScheduleRetry(logical_action=f"model:{purpose}", delay=delay), self._context())
            events.append(self._event(stored, ev.WaitStarted, offset=3, status=status, wait=wait))
        await self._commit(stored, events, fence, release=True)

    def _retry_delay(self, policy: RetryPolicy, attempts: int, error: Exception,
                     cause: str) -> tuple[float | None, str]:
        """Seconds until the next attempt after ``attempts`` failed, the last with ``error`` (``cause``
        says what it was); or None, and why not, when the policy does not retry it."""
        if not retryable(policy, _type_names(error)):
            return None, f"{type(error).__name__} is not retried: {cause}"
        return next_delay(policy, attempts, rng=self.rng), f"retries exhausted after {attempts} attempts: {cause}"

    async def _call_tool(self, stored: StoredRun, fence: Fence, kind: RunKind,
                         decision: CallTool) -> StoredRun | None:
        run = stored.snapshot
        tool = kind.tools[decision.tool]
        try:
            args = tool.validate(thaw(decision.args))
        except ToolRejected as e:
            return await self._finish(stored, fence, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION,
                                      reason=str(e))
        name = decision.logical_action
        record = run.action(name)
        key = record.idempotency_key if record else idempotency_key(run.run_id, name, attempt_scope=1)
        events: list[ev.RunEvent] = []
        if record is None:
            requested = request_hash(tool.name, tool.version, args=args)
            approval_id = decision.approval_id
            if run.permissions is not None:
                # Before anything is prepared: a call outside the scope is refused, never retried.
                resource = tool.resource(args) if tool.resource is not None else None
                why, approval_id = await self._scope_check(run, kind, tool, name, resource, requested,
                                                           decision.approval_id)
                if why is not None:
                    return await self._refuse(stored, fence, kind, tool, name, resource, requested, why)
            events.append(self._event(stored, ev.ActionPrepared, logical_action=name, tool=tool.name,
                                      tool_version=tool.version, effect_kind=tool.effect, idempotency_key=key,
                                      approval_id=approval_id, request_hash=requested))
        elif record.status is ActionStatus.SUBMITTED and recovery_policy(tool.effect) is RecoveryPolicy.RECONCILE:
            # A non-idempotent write that may have happened before a crash: never blind-retry it.
            return await self._record_outcome(stored, fence, key, ActionStatus.UNKNOWN, lambda s: [
                self._event(s, ev.ActionUnknown, logical_action=name,
                            cause="submitted before a crash; outcome not recorded"),
                *self._park_for_reconciliation(s, f"{name} needs reconciliation")])
        elif record.status is not ActionStatus.SUBMITTED and record.status is not ActionStatus.RETRYABLE:
            return await self._finish(stored, fence, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION,
                                      reason=f"decide asked again for {name}, already {record.status.value}")
        probe = False
        if self.breakers is not None:
            admission = await self.breakers.admit(tool.health_key, run.run_id)
            if admission is Admission.WAIT:
                return await self._wait_for_health(stored, fence, tool.health_key, name)
            probe = admission is Admission.PROBE
        # A SUBMITTED pure, read or idempotent action re-runs under the same key after a crash: the
        # same submission, charged when it was first made.
        ledger_row = (tool, name, key, args)
        pending: list[ev.RunEvent] = []
        limit = start_to_close(tool, run)

        def timers() -> tuple[dict[str, Any], ...]:
            """A call on record before it runs is watched by durable timers, scheduled with that record."""
            return calls.call_timers(run.run_id, name, token=fence.token, start_to_close=limit,
                                     heartbeat_timeout=tool.heartbeat_timeout)

        if record is None or record.status is ActionStatus.RETRYABLE:
            events.append(self._event(stored, ev.ActionSubmitted, offset=len(events) + 1, logical_action=name))
            events.append(self._event(stored, ev.BudgetCharged, offset=len(events) + 1, tool_calls=1))
            if record is None and tool.effect in RECORDED_WITH_THE_ANSWER and tool.heartbeat_timeout is None:
                pending = events
            else:
                stored = await self._commit(stored, events, fence, ledger_row=ledger_row, timers=timers())
        else:
            await self._resend(stored, fence, ledger_row, timers())
        self.crash_point("worker.before_tool_request")
        try:
            result = await supervise(_traced_call(tool, name, args, key, fence.token),
                                     self._watch(run, fence, tool, name, key, on_record=not pending),
                                     start_to_close=limit, heartbeat_timeout=tool.heartbeat_timeout)
        except (ActionOutcomeUnknown, TimeoutError) as e:
            stored = await self._submitted(stored, pending, fence, ledger_row)
            cause = str(e) or type(e).__name__
            if tool.effect in RECORDED_WITH_THE_ANSWER:
                # Asking a pure or read tool again changes nothing: no answer is retried, not reconciled.
                return await self._unavailable(stored, fence, tool, name, key, e, probe=probe, cause=cause)
            return await self._record_outcome(stored, fence, key, ActionStatus.UNKNOWN, lambda s: [
                self._event(s, ev.ActionUnknown, logical_action=name, cause=cause),
                *self._park_for_reconciliation(s, f"{name}: outcome unknown ({cause})")], last_error=cause)
        except ToolUnavailable as e:
            stored = await self._submitted(stored, pending, fence, ledger_row)
            return await self._unavailable(stored, fence, tool, name, key, e, probe=probe, cause=str(e))
        except ToolRejected as e:
            rejection = str(e)
            stored = await self._submitted(stored, pending, fence, ledger_row)
            await self._healthy(tool, probe=probe)
            return await self._record_outcome(stored, fence, key, ActionStatus.FAILED, lambda s: [
                self._event(s, ev.ActionFailed, logical_action=name, error=rejection)], last_error=rejection)
        self.crash_point("worker.after_tool_response_before_record")
        await self._healthy(tool, probe=probe)
        if pending:
            return await self._confirm_with_request(stored, pending, fence, ledger_row, result)
        return await self._confirm(stored, fence, tool, name, key, result)

    def _watch(self, run: RunSnapshot, fence: Fence, tool: Tool, name: str, key: str, *,
               on_record: bool) -> Call | Unrecorded:
        """What the call's heartbeats report to: written to its ledger row (moving its heartbeat timer)
        when it is on record, at most every third of its heartbeat timeout (or of start-to-close)."""
        if not on_record:
            return UNRECORDED
        limit = tool.heartbeat_timeout or start_to_close(tool, run)
        timer = (None if tool.heartbeat_timeout is None
                 else calls.call_timer_key(run.run_id, name, fence.token, calls.HEARTBEAT))
        due_in = limit + calls.grace(limit)

        async def record(details: Mapping[str, Any] | None) -> bool:
            return await self.store.beat(key, fence.token, details, timer_key=timer, due_in=due_in)

        return Call(record=record, interval=limit / 3, refused=LeaseLost(run.run_id, fence.token))

    async def _wait_for_health(self, stored: StoredRun, fence: Fence, far_side: str, logical_action: str) -> None:
        """Not worth calling now: wait, uncharged, until ``far_side`` is healthy (or its probe is this run's)."""
        ctx = self._context()
        wait = health_wait(wait_id=ctx.new_id(), far_side=far_side, logical_action=logical_action, now=ctx.now,
                           max_wait=self.health_max_wait)
        await self._finish(stored, fence, ev.WaitStarted, status=RunStatus.RETRY_SCHEDULED, wait=wait)

    async def _healthy(self, tool: Tool, *, probe: bool) -> None:
        """The far side answered: its breaker closes (written only for a probe, or if anything was counted)."""
        if self.breakers is not None:
            await self.breakers.succeeded(tool.health_key, probe=probe)

    async def _unavailable(self, stored: StoredRun, fence: Fence, tool: Tool, name: str, key: str,
                           error: Exception, *, probe: bool, cause: str) -> StoredRun | None:
        """Definitely not applied, or a pure or read call that did not answer (``cause`` says which):
        the action is RETRYABLE, and its next attempt (charged) waits on a durable timer for the retry
        policy's delay, or, while the far side's breaker is open, until it is healthy again. Past the policy's attempts, or for an error it does not retry, the action
        FAILED, which the run kind's ``decide`` sees; a failed probe waits for the next one instead."""
        breaker = await self.breakers.failed(tool.health_key) if self.breakers is not None else None
        waits_for_health = breaker is not None and breaker.state is not BreakerState.CLOSED
        record = stored.snapshot.action(name)
        assert record is not None
        policy = tool.retry or self.retry
        delay, failure = self._retry_delay(policy, record.attempts, error, cause)
        # A probe tried the far side for every run waiting on it: its failure is charged to this run,
        # but does not use up its attempts; the breaker says when it goes again.
        probed = probe and waits_for_health and retryable(policy, _type_names(error))
        if delay is None and not probed:
            logger.info("run %s: %s unavailable: %s", stored.snapshot.run_id, tool.name, failure)
            return await self._record_outcome(stored, fence, key, ActionStatus.FAILED, lambda s: [
                self._event(s, ev.ActionFailed, logical_action=name, error=failure)], last_error=failure)
        logger.info("run %s: %s unavailable (%s); %s", stored.snapshot.run_id, tool.name, cause,
                    "waits for it to be healthy" if waits_for_health else f"attempt {record.attempts + 1} in {delay}s")

        def unavailable(s: StoredRun) -> list[ev.RunEvent]:
            events = [self._event(s, ev.ActionUnavailable, logical_action=name, cause=cause)]
            if s.snapshot.status is not RunStatus.RUNNING:  # an operator's pause or cancel keeps the run there
                return events
            ctx = self._context()
            if waits_for_health or delay is None:
                wait = health_wait(wait_id=ctx.new_id(), far_side=tool.health_key, logical_action=name, now=ctx.now,
                                   max_wait=self.health_max_wait)
            else:
                wait = wait_for(ScheduleRetry(logical_action=name, delay=delay), ctx)[1]
            return [*events, self._event(s, ev.WaitStarted, offset=2, status=RunStatus.RETRY_SCHEDULED, wait=wait)]

        return await self._record_outcome(stored, fence, key, ActionStatus.RETRYABLE, unavailable,
                                          last_error=cause)

    async def _scope_check(self, run: RunSnapshot, kind: RunKind, tool: Tool, name: str, resource: str | None,
                           requested: str, approval_id: str | None) -> tuple[str | None, str | None]:
        """(Why the call is refused, or None; the approval it is prepared under). Pure unless the call
        is approved: an approval was given under the tenant policy of its time, so an approved call
        reads the tenant's current policy and, if it changed since the run's scope was set, is
        checked against the scope narrowed by it too; a person's exception to the scope does not
        survive any policy change."""
        scope = run.permissions
        assert scope is not None
        why = refusal(scope, tool.name, resource)
        exception = SCOPE_APPROVAL_PREFIX + name
        excepted = why is not None and kind.scope_approval is not None and _approves(run, exception, requested)
        if why is not None and not excepted:
            return why, None
        if approval_id is None and not excepted:
            return None, None
        # The ledger binds the call to decide's own approval; a scope exception is checked here.
        approval_id = approval_id if approval_id is not None else exception
        policy = await self.store.tenant_policy(run.tenant_id)
        current = revalidated(scope, policy)
        if current is scope:
            return None, approval_id
        assert policy is not None
        again = why if excepted else refusal(current, tool.name, resource)
        if again is None:
            return None, approval_id
        voided = exception if excepted else approval_id
        return (f"approval {voided!r} no longer holds: the tenant policy changed from v{scope.policy_version} "
                f"to v{policy.version}; {again}"), None

    async def _refuse(self, stored: StoredRun, fence: Fence, kind: RunKind, tool: Tool, name: str,
                      resource: str | None, requested: str, why: str) -> None:
        """The refusal on record (``run.permission_denied``), then NEEDS_ATTENTION; or, where the run
        kind lets a person approve a call outside the scope, a wait for that approval, asked once."""
        run = stored.snapshot
        asked = run.fact(DENIED_FACT_PREFIX + name) is not None
        denied = self._event(stored, ev.PermissionDenied, logical_action=name, tool=tool.name, resource=resource,
                             request_hash=requested, reason=why)
        ask = kind.scope_approval
        if ask is None or asked:
            then = self._event(stored, ev.RunStatusChanged, offset=2, to=RunStatus.NEEDS_ATTENTION,
                               reason=f"permission denied: {why}")
        else:
            ctx = self._context()
            status, wait = wait_for(WaitForUser(approval_id=SCOPE_APPROVAL_PREFIX + name, owner=ask.owner,
                                                deadline=ctx.now + ask.timeout, approved_hash=requested,
                                                summary=f"allow {name} outside the run's scope: {why}"), ctx)
            then = self._event(stored, ev.WaitStarted, offset=2, status=status, wait=wait)
        await self._commit(stored, [denied, then], fence, release=True)

    async def _submitted(self, stored: StoredRun, pending: list[ev.RunEvent], fence: Fence,
                         ledger_row: tuple[Tool, str, str, dict[str, Any]]) -> StoredRun:
        """A call recorded with its answer got none: its submission goes on record first, as for a write."""
        if not pending:
            return stored
        return await self._commit(stored, pending, fence, ledger_row=ledger_row)

    async def _confirm_with_request(self, stored: StoredRun, pending: list[ev.RunEvent], fence: Fence,
                                    ledger_row: tuple[Tool, str, str, dict[str, Any]],
                                    result: ToolResult) -> StoredRun:
        """Prepared, submitted, charged and confirmed as one event (``action.recorded``, with the
        receipt) in the run's next transaction. The step is written with the decision after it, unless
        that decision asks the world for more (a call: ``_round`` writes the step first), so a run's
        last step commits with its completion or wait. Losing a race to another writer (StaleRevision)
        records nothing: the step is decided again on the new state, and a pure or read call may
        simply run again."""
        prepared = pending[0]
        assert isinstance(prepared, ev.ActionPrepared)
        receipt, ref, size = await self._receipt(result)
        events = [self._event(stored, ev.ActionRecorded, **ev.request_of(prepared), external_id=result.external_id,
                              receipt_ref=ref, receipt=freeze(receipt))]
        answer = self._answer(result, receipt, ref)
        if ref is None:
            return runs.defer(stored, events,
                              request=self._request(stored.snapshot.run_id, fence, ledger_row, answer))
        return await self._commit(stored, events, fence, ledger_row=ledger_row, answer=answer,
                                  artifact=Artifact(ref, size))

    async def _confirm(self, stored: StoredRun, fence: Fence, tool: Tool, logical_action: str, key: str,
                       result: ToolResult) -> StoredRun | None:
        receipt, ref, size = await self._receipt(result)
        return await self._record_outcome(
            stored, fence, key, ActionStatus.CONFIRMED,
            lambda s: self._confirmation(s, tool, logical_action, result, receipt, ref),
            artifact=Artifact(ref, size) if ref else None, **self._answer(result, receipt, ref))

    async def _receipt(self, result: ToolResult) -> tuple[dict[str, Any], str | None, int]:
        """The receipt the run keeps (inline, or a reference to the uploaded original), its reference and size."""
        receipt, ref = dict(result.receipt), None
        body = json.dumps(receipt, sort_keys=True).encode()
        if len(body) > INLINE_LIMIT:
            # Upload first; the reference commits with the confirmation.
            ref = await self.artifacts.put(body)
            receipt = {"artifact": ref, "size": len(body), "external_id": result.external_id}
        return receipt, ref, len(body)

    def _confirmation(self, stored: StoredRun, tool: Tool, logical_action: str, result: ToolResult,
                      receipt: dict[str, Any], ref: str | None, *, offset: int = 1) -> list[ev.RunEvent]:
        return [self._event(stored, ev.ActionConfirmed, offset=offset, logical_action=logical_action,
                            external_id=result.external_id, receipt_ref=ref),
                self._event(stored, ev.FactRecorded, offset=offset + 1, key=f"{RECEIPT_FACT_PREFIX}{logical_action}",
                            value=freeze(receipt), source=f"tool:{tool.name}")]

    @staticmethod
    def _answer(result: ToolResult, receipt: dict[str, Any], ref: str | None) -> dict[str, Any]:
        """The ledger columns of a confirmed call."""
        return {"external_id": result.external_id, "receipt": dict(result.receipt) if ref is None else receipt,
                "receipt_ref": ref}

    def _park_for_reconciliation(self, stored: StoredRun, reason: str) -> list[ev.RunEvent]:
        """The move to ACTION_UNKNOWN after an ``action.unknown`` (at offset 1), while the run is still
        this step's. An operator may have cancelled or paused it meanwhile (the outcome is then
        recorded on the new state): it stays where it was, and cancelling waits for the reconciler."""
        if stored.snapshot.status is not RunStatus.RUNNING:
            return []
        return [self._event(stored, ev.RunStatusChanged, offset=2, to=RunStatus.ACTION_UNKNOWN, reason=reason)]

    async def _record_outcome(self, stored: StoredRun, fence: Fence, key: str, status: ActionStatus,
                              build: Callable[[StoredRun], list[ev.RunEvent]], *, release: bool = False,
                              artifact: Artifact | None = None, **fields: Any) -> StoredRun | None:
        """Record what the far side answered; a concurrent append only makes us rebuild on the new state,
        because an effect that happened must be recorded, not re-requested."""
        if stored.unwritten_request is not None:
            stored = await self._commit(stored, [], fence)  # the call before this one goes on record first
        while True:
            events = build(stored)
            parked = release or any(isinstance(e, ev.RunStatusChanged | ev.WaitStarted) for e in events)
            planned = runs.plan(stored, events, release_lease=parked)
            try:
                after = await self.store.write_together(planned, fence, self._rides(stored, planned),
                                                        artifact=artifact, outcome=LedgerOutcome(key, status, fields),
                                                        settle_wait=parked and planned.after.snapshot.wait is not None)
            except StaleRevision:
                reloaded = await self._load(stored.snapshot.run_id, fence)
                if reloaded is None:
                    raise LeaseLost(stored.snapshot.run_id, fence.token) from None
                stored = reloaded
                continue
            return None if parked else after

    async def _commit(self, stored: StoredRun, events: Sequence[ev.RunEvent], fence: Fence, *,
                      release: bool = False,
                      ledger_row: tuple[Tool, str, str, dict[str, Any]] | None = None,
                      answer: dict[str, Any] | None = None,
                      artifact: Artifact | None = None,
                      timers: Sequence[Mapping[str, Any]] = ()) -> StoredRun:
        """``ledger_row`` is recorded SUBMITTED, or CONFIRMED with the ledger columns of its ``answer``;
        ``timers`` (a call's) are scheduled in the same statement.

        The common step (events, a first ledger row, a broadcast) is one statement outside any
        transaction; an artifact, a ledger key used before, or a wait to schedule and match make it
        a transaction of several."""
        if not events and not stored.unwritten:
            await self.store.release_lease(stored.snapshot.run_id, fence)
            return stored
        planned = runs.plan(stored, events, release_lease=release)
        rides = self._rides(stored, planned)
        if timers:
            rides = replace(rides, timers=timers)
        request = stored.unwritten_request  # a first call recorded among the unwritten events
        first = request is not None
        if ledger_row is not None:
            if request is not None:
                raise ValueError(f"run {stored.snapshot.run_id}: a deferred call must be written before another")
            request = self._request(stored.snapshot.run_id, fence, ledger_row, answer)
            first = stored.snapshot.action(ledger_row[1]) is None
        if request is not None and first:
            rides = replace(rides, action=ledger.first_row(**request))
        waits = release and planned.after.snapshot.wait is not None
        if artifact is None and (request is None or first) and not waits:
            try:
                after = await self.store.write(planned, fence, rides)
            except LedgerKeyTaken:
                # The key is on the ledger after all: record another attempt of the same request,
                # or refuse it naming both hashes.
                after = await self.store.write_together(planned, fence, replace(rides, action=None), attempt=request,
                                                        settle_wait=planned.release_lease)
        else:
            # A first ledger row rides in the statement; a key used before is one more attempt.
            after = await self.store.write_together(planned, fence, rides, artifact=artifact,
                                                    attempt=None if first else request,
                                                    settle_wait=planned.release_lease)
        self.crash_point("worker.after_commit")
        return after

    async def _resend(self, stored: StoredRun, fence: Fence, ledger_row: tuple[Tool, str, str, dict[str, Any]],
                      timers: Sequence[Mapping[str, Any]]) -> None:
        """The same submission sent again by a new lease holder: one more attempt on the ledger,
        under the new fencing token, watched by its own timers; no event and no charge (it was
        charged when first made)."""
        await self.store.resend(stored.snapshot.run_id, fence, self.lease_ttl,
                                self._request(stored.snapshot.run_id, fence, ledger_row, None), timers)

    @staticmethod
    def _request(run_id: str, fence: Fence, ledger_row: tuple[Tool, str, str, dict[str, Any]],
                 answer: dict[str, Any] | None) -> dict[str, Any]:
        """The ledger's arguments for this request (``ledger.prepare``, ``ledger.first_row``)."""
        tool, logical_action, key, args = ledger_row
        return {"action_id": str(uuid.uuid4()), "run_id": run_id, "logical_action": logical_action,
                "tool": tool.name, "tool_version": tool.version, "effect_kind": tool.effect.value,
                "idempotency_key": key, "request_hash": request_hash(tool.name, tool.version, args=args),
                "request": args, "fencing_token": fence.token,
                **({} if answer is None else {"status": ActionStatus.CONFIRMED, **answer})}

    def _rides(self, stored: StoredRun, planned: runs.Planned) -> runs.Rides:
        run = stored.snapshot
        cause, public = _CAUSE.get(), self.kinds.public_receipts(run.kind, run.versions.workflow)
        rides = effects.broadcast_rides(run, planned.after, producer=PRODUCER, cause=cause, public=public,
                                        handover=self.handover)
        if stored.written is None:
            return rides
        # A move deferred to this write (READY -> RUNNING) is announced too, first, as if written alone.
        deferred = effects.broadcast_message(stored.written.snapshot, stored, producer=PRODUCER, cause=cause)
        return rides if deferred is None else replace(rides, messages=(deferred, *rides.messages))

    def _event(self, stored: StoredRun, cls: type[ev.RunEvent], *, offset: int = 1, **fields: Any) -> ev.RunEvent:
        return cls(seq=stored.seq(offset), at=self.clock(), **fields)


def _approves(run: RunSnapshot, approval_id: str, requested: str) -> bool:
    """Whether the run holds a person's approval ``approval_id`` of exactly the request ``requested``."""
    fact = run.fact(APPROVAL_FACT_PREFIX + approval_id)
    decision = fact.value if fact is not None else None
    return (isinstance(decision, Mapping) and decision.get("approved") is True
            and decision.get("approved_hash") == requested)


async def _traced_call(tool: Tool, logical_action: str, args: dict[str, Any], key: str, token: int) -> ToolResult:
    """A tool call, in its span (GenAI's ``execute_tool``) when spans are exported."""
    if not otel.exporting():
        return await tool.execute(args, key, token)
    with otel.tracer.start_as_current_span(f"execute_tool {tool.name}", kind=SpanKind.CLIENT, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool.name,
            "longrun.tool.version": tool.version, "longrun.tool.effect": tool.effect.value, "longrun.logical_action": logical_action,
            "longrun.idempotency_key": key, "longrun.fencing_token": token}):
        return await tool.execute(args, key, token)


async def _traced_propose(model: ModelAdapter, purpose: str, context: dict[str, Any],
                          allowed: tuple[str, ...]) -> Proposal:
    """A model call, in its span (GenAI's ``chat``: model, tokens in and out, cost) when spans are exported."""
    if not otel.exporting():
        return await model.propose(context=context, allowed_actions=allowed)
    name = getattr(model, "model", type(model).__name__)
    with otel.tracer.start_as_current_span(f"chat {name}", kind=SpanKind.CLIENT, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": name, "longrun.model.purpose": purpose}) as span:
        answer = await model.propose(context=context, allowed_actions=allowed)
        span.set_attributes({"gen_ai.usage.input_tokens": answer.usage.input_tokens,
                             "gen_ai.usage.output_tokens": answer.usage.output_tokens,
                             "longrun.model.cost_usd": answer.usage.cost_usd,
                             "longrun.model.proposed_action": answer.action})
        return answer
