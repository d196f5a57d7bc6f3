"""The ensemble around the workers, in memory: the bus (pending and delivered messages), the
scheduler's creation, the timer service, the gateway's webhook intake, the operator API, signals and
the reconciler's sweeps — each the runtime's own use case (``app.scheduler.admit``, ``app.timer.firing.plan_batch``,
``app.gateway.webhooks``, ``app.gateway.operate``, ``app.signals``, ``app.reconciler``) over the in-memory adapters
(``testing.transaction``, ``testing.reconcile_store``, ``testing.cleanup_store``), one transaction at a time. Workers are the
real ``Worker`` (``app.worker``) over ``testing.workers.MemoryWorkerStore``.

Beside them, what tests drive the engine with: ``FarSide``, the external system (it counts
executions per idempotency key, keeps one object per key, answers lookups, fails calls on request
and checks fencing tokens), and two run kinds, ``steps`` and ``gated`` (steps behind a webhook and
an approval, then a non-idempotent publish).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

# The runtime's own rules where they are plain values, so the model cannot drift from them.
from longrun.app import signals
from longrun.app.gateway import operate, webhooks
from longrun.app.scheduler import admit
from longrun.app.timer import firing
from longrun.app.timer.schedules import Admission
from longrun.authoring import Registry, RunKind, Tool, ToolResult
from longrun.ports.webhooks import Translated
from longrun.domain import (
    ActionStatus,
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    Fail,
    FrozenMap,
    JsonValue,
    PinnedVersions,
    RetryPolicy,
    RunSnapshot,
    TenantPolicy,
    WaitForEvent,
    WaitForUser,
    WakeReason,
    freeze,
    request_hash,
    thaw,
)
from longrun.db import outbox
from longrun.envelope import Envelope, make
from longrun.errors import ActionOutcomeUnknown, ToolRejected, ToolUnavailable
from longrun.principals import GROUP_PREFIX, Principal
from longrun.testing import admission, cleanup_store, reconcile_store
from longrun.testing.checkpoints import checkpoint
from longrun.testing.memory import FakeClock, MemoryStore
from longrun.testing.rate_limits import MemoryRateLimits
from longrun.testing.schedules import MemorySchedules
from longrun.testing.transaction import MemoryTransaction
from longrun.workflows import steps

_A = ActionStatus
T = TypeVar("T")
SLOTS = 1_000
"""Every tenant's slots: the memory world admits every run at creation, but one waiting for its
concurrency key (admitted by the round a finished run's notice starts, ``admit``)."""
AGING = 60.0
"""Seconds per priority point a queued run gains (``LONGRUN_PRIORITY_AGING``)."""
MAX_INPUT_BYTES = 262_144


# -- the far side -------------------------------------------------------------------------------------


FAULTS = ("ok", "unavailable", "rejected", "timeout_after_acting")


Answer = Callable[[Mapping[str, Any], str], ToolResult]
"""What a tool's far side answers a request (its arguments, its idempotency key)."""


def echo_answer(tool: str) -> Answer:
    """The default answer: a receipt naming the tool and the key, with the arguments."""
    return lambda args, key: ToolResult(key, {"tool": tool, "key": key, **args})


@dataclass
class FarSide:
    """The external system. ``executions`` counts what it did per (tool, idempotency key); it keeps
    what it made under each key (an idempotent write asked again gets the same object back) and
    answers lookups by key."""

    fencing: bool = True
    """Refuse a request whose fencing token is lower than one already seen for its key."""
    answers: dict[str, Answer] = field(default_factory=dict)
    """Per tool name; a tool without one gets ``echo_answer``."""
    executions: Counter[tuple[str, str]] = field(default_factory=Counter)
    objects: dict[str, ToolResult] = field(default_factory=dict)
    highest_token: dict[str, int] = field(default_factory=dict)
    armed: list[str] = field(default_factory=list)
    slow: Callable[[str, Mapping[str, Any]], int] = lambda tool, args: 0
    """Per request (its tool and arguments): how many turns of the event loop pass before the far side
    acts and answers, while the worker's other tasks go on."""

    def arm(self, fault: str) -> None:
        assert fault in FAULTS
        self.armed.append(fault)

    def call(self, tool: str, args: Mapping[str, Any], key: str, token: int) -> ToolResult:
        fault = self.armed.pop(0) if self.armed else "ok"
        if fault == "unavailable":
            raise ToolUnavailable(tool, "injected: nothing was done")
        if fault == "rejected":
            raise ToolRejected(tool, 422, "injected: refused")
        if self.fencing and token < self.highest_token.get(key, 0):
            raise ToolRejected(tool, 409, f"fencing token {token} is stale for {key}")
        self.highest_token[key] = max(token, self.highest_token.get(key, 0))
        self.executions[(tool, key)] += 1
        if key not in self.objects:
            self.objects[key] = self.answers.get(tool, echo_answer(tool))(dict(thaw(args)), key)  # type: ignore[call-overload]
        if fault == "timeout_after_acting":
            raise ActionOutcomeUnknown(tool, key, "injected: no answer after acting")
        return self.objects[key]

    def lookup(self, key: str) -> ToolResult | None:
        return self.objects.get(key)


# -- workflows for the model ------------------------------------------------------------------------------

ECHO = steps.ECHO.name
"""The ``steps`` workflow's tool; here it calls the far side (so faults reach it too)."""
PUBLISH = "probe.publish"
PUBLISH_VERSION = "1"
VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="memory-v1")
GATED_KIND = "gated"
CI_TIMEOUT = 120.0
APPROVAL_TIMEOUT = 300.0
APPROVAL_ID = "release"


def ci_key(run_id: str) -> str:
    return f"ci/{run_id}"


def publish_args(state: RunSnapshot) -> dict[str, Any]:
    return {"run": state.run_id, "what": "release"}


def publish_hash(state: RunSnapshot) -> str:
    return request_hash(PUBLISH, PUBLISH_VERSION, args=publish_args(state))


def _confirmed(state: RunSnapshot, logical_action: str) -> bool:
    record = state.action(logical_action)
    return record is not None and record.status is _A.CONFIRMED


class Gated:
    """``steps`` behind a webhook and an approval: K echo steps, wait for a CI webhook, wait for
    the approval of the exact publish request, publish once (a non-idempotent write gated by
    that approval), complete."""

    kind = GATED_KIND

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        total = int(thaw(state.goal).get("steps", 2))  # type: ignore[union-attr]
        for i in range(total):
            if not _confirmed(state, f"step:{i}"):
                return CallTool(tool=ECHO, logical_action=f"step:{i}", args=freeze({"step": i}))  # type: ignore[arg-type]
        deadline_passed = state.last_wake is not None and state.last_wake.reason is WakeReason.DEADLINE
        if state.fact(f"ci_result:{state.run_id}") is None:
            if deadline_passed:
                return Fail(reason="CI did not report before its deadline")
            return WaitForEvent(kind="ci", correlation_key=ci_key(state.run_id), deadline=ctx.now + CI_TIMEOUT,
                                provider="forge")
        approved_hash = publish_hash(state)
        decision = state.fact(f"approval.{APPROVAL_ID}")
        value = thaw(decision.value) if decision is not None else None
        if not isinstance(value, dict) or value["approved_hash"] != approved_hash:
            if deadline_passed and value is None:
                return Fail(reason="approval was not given before its deadline")
            return WaitForUser(approval_id=APPROVAL_ID, owner="owner", deadline=ctx.now + APPROVAL_TIMEOUT,
                               approved_hash=approved_hash, summary="publish the release")
        if not value["approved"]:
            return Fail(reason=f"publish denied by {value['decided_by']}")
        if not _confirmed(state, "publish"):
            return CallTool(tool=PUBLISH, logical_action="publish", args=freeze(publish_args(state)),  # type: ignore[arg-type]
                            approval_id=APPROVAL_ID)
        return Complete(evidence=freeze({"steps": total, "published": True}))  # type: ignore[arg-type]

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        total = int(thaw(evidence)["steps"])  # type: ignore[index]
        unmet = [f"step:{i}" for i in range(total) if not _confirmed(state, f"step:{i}")]
        if not _confirmed(state, "publish"):
            unmet.append("publish")
        return tuple(unmet)


class PublishArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run: str
    what: str


def far_side_tool(far_side: FarSide, name: str, version: str, effect: EffectKind, args: type[BaseModel], *,
                  lookup: bool) -> Tool:
    """A tool whose calls (and, with ``lookup``, lookups by key) go to ``far_side``: a test may stop
    the calling task just before the request and just after the answer (``checkpoint``)."""
    async def execute(arguments: Mapping[str, Any], key: str, token: int) -> ToolResult:
        await checkpoint("tool request")
        for _ in range(far_side.slow(name, arguments)):
            await asyncio.sleep(0)
        try:
            return far_side.call(name, arguments, key, token)
        finally:
            await checkpoint("tool answered")

    async def find(key: str) -> ToolResult | None:
        return far_side.lookup(key)

    # Far above any test's pace: a time-out here would be real time, not the test's clock.
    return Tool(name, version, effect, args, execute, find if lookup else None, start_to_close=3600.0)


def on_far_side(kind: RunKind, far_side: FarSide) -> RunKind:
    """``kind`` with every tool's calls (and lookups, where it declares them) going to ``far_side``;
    names, versions, effect kinds, argument schemas and public receipt fields unchanged."""
    tools = {}
    for name, tool in kind.tools.items():
        called = far_side_tool(far_side, name, tool.version, tool.effect, tool.args, lookup=tool.lookup is not None)
        tools[name] = replace(tool, execute=called.execute, lookup=called.lookup, start_to_close=called.start_to_close)
    return replace(kind, tools=tools)


def registry(far_side: FarSide) -> Registry:
    """``steps`` and ``gated``, their tools calling ``far_side``."""
    echo = far_side_tool(far_side, ECHO, steps.ECHO.version, steps.ECHO.effect, steps.EchoArgs, lookup=False)
    publish = far_side_tool(far_side, PUBLISH, PUBLISH_VERSION, EffectKind.NON_IDEMPOTENT_WRITE, PublishArgs,
                            lookup=True)
    return Registry([RunKind(steps.KIND, VERSIONS, steps.Steps(), {ECHO: echo}),
                     RunKind(GATED_KIND, VERSIONS, Gated(), {ECHO: echo, PUBLISH: publish})])


# -- the rest of the ensemble ---------------------------------------------------------------------------------


Webhook = Translated
"""A provider's event as longrun reads it: its id, the wait it answers and the fact it proves."""
PROVIDER = "forge"


class World:
    """The ensemble around the workers, in memory: bus, scheduler, timers, gateway, operator, reconciler."""

    def __init__(self, *, far_side: FarSide | None = None, kinds: Registry | None = None,
                 lease_ttl: float = 5.0) -> None:
        """``kinds``: run kinds whose tools call ``far_side`` (``on_far_side``); by default ``registry``'s."""
        self.clock = FakeClock()
        self.store = MemoryStore(self.clock)
        self.rate_limits = MemoryRateLimits(self.clock)
        """The far sides' token buckets every worker shares."""
        self.far_side = far_side or FarSide()
        self.kinds = kinds or registry(self.far_side)
        self.lease_ttl = lease_ttl
        self.pending: list[Envelope] = []
        """Published wakeups not yet delivered."""
        self.delivered: list[Envelope] = []
        """Delivered wakeups; the broker may deliver any of them again."""
        self.kept: dict[tuple[str, str], tuple[Webhook, str | None]] = {}
        """The gateway's webhook_events: (provider, event id) -> (event, matched run)."""
        self.audit_log: list[dict[str, Any]] = []
        """The operators' audit rows."""
        self.policies: dict[str, TenantPolicy] = {}
        """The tenants' policies (``tenant_policies``), by tenant."""
        self.tenant_slots: dict[str, int] = {}
        """The tenants' own run slots (``tenant_limits.run_slots``), by tenant; the others have the platform's."""
        self.loop = asyncio.new_event_loop()
        """Where the workers' steps run (``testing.workers``), a checkpoint at a time."""
        self.broadcasts: list[Envelope] = []
        """Status broadcasts the workers' transitions carried, in order."""
        self.artifacts: dict[str, int] = {}
        """Registered artifacts: reference -> size."""
        self.stored_objects: dict[str, bytes] = {}
        """The artifact store every worker shares (``MemoryArtifacts``): object key -> bytes."""
        """The gateway's webhook_events: event id -> (event, matched run)."""
        self._ids = itertools.count(1)
        self.schedules = MemorySchedules(self, Admission(self.kinds, 1, SLOTS, MAX_INPUT_BYTES))
        """The schedules, fired by ``fire_due_schedules``."""

    def close(self) -> None:
        """Stop every worker task still waiting at a checkpoint, and the loop."""
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.wait(tasks))
        self.loop.close()

    def new_id(self, prefix: str = "id") -> str:
        return f"{prefix}-{next(self._ids)}"

    # -- the scheduler (app/scheduler/admit.py) ------------------------------------------------------------------
    def create(self, *, tenant_id: str, key: str, kind: str, goal: Mapping[str, Any],
               tool_calls: int = 50, timeouts: Mapping[str, float] | None = None) -> str:
        """The scheduler's create (``app.scheduler.admit.create_run``): the run (or the one made under ``key``),
        announced and admitted at once; its id."""
        request = make("run.create", {"workflow": kind, "idempotency_key": key, "input": dict(goal),
                                      "budget": {"model_calls": 5, "tool_calls": tool_calls, "cost_usd": 5.0},
                                      "timeouts": None if timeouts is None else dict(timeouts)},
                       producer="memory", tenant_id=tenant_id)
        answer = self.in_transaction(lambda tx: admit.create_run(
            tx, request, kinds=self.kinds, partitions=1, slots=SLOTS, max_input_bytes=MAX_INPUT_BYTES,
            clock=self.clock, new_id=lambda: self.new_id("run"))).outcome
        if "run_id" not in answer:
            raise ValueError(f"create refused: {answer}")
        self.admit(tenant_id)
        return str(answer["run_id"])

    def admit(self, tenant_id: str) -> None:
        """The scheduler's admission round for the tenant (``testing.admission``)."""
        self.send(admission.admit(self.store, tenant_id, slots=SLOTS, aging_seconds=AGING, now=self.clock()))

    # -- the timer service (app/timers.py, wait timers) -------------------------------------------------
    def fire_due_timers(self) -> int:
        """The timer service's batch through the domain (``app.timer.firing.plan_batch``; the bulk SQL path
        is held to it by tests/integration/test_differential_timers.py): how many timers fired."""
        with self.store.transaction():
            claimed = self.store.claim_due(limit=10_000)
            if claimed is None:
                return 0
            ordered = sorted(claimed.timers, key=lambda t: (t.run_id, t.wake_at))
            current = {t.run_id: self.store.load(t.run_id) for t in ordered}
            fired = firing.plan_batch(ordered, current, at=self.clock(), now=claimed.now,  # type: ignore[arg-type]
                                      producer="timer", kinds=self.kinds, retry=RetryPolicy(), rng=random.Random(0))
            self.store.write_many(fired.plans)
            for outcome in fired.ledger:
                self.store.record(outcome.key, outcome.status, **outcome.fields)
            for timer in fired.timers:
                self.store.schedule(**timer)
            self.send([m for sent in fired.messages.values() for m in sent])
            self.store.mark_fired(list(fired.outcomes))
        # A run woken from a wait that held no slot is queued: the scheduler's next round admits it.
        for tenant in sorted({self.store.runs[t.run_id].tenant_id for t in ordered}):
            self.admit(tenant)
        return len(fired.outcomes)

    def fire_due_schedules(self) -> int:
        """The timer service's round of due schedules (``app.timer.schedules``): how many fired."""
        return self.schedules.fire_due()

    # -- one transaction of the runtime's use cases ---------------------------------------------------
    def in_transaction(self, use_case: Callable[[MemoryTransaction], Awaitable[T]]) -> T:
        """Run an operator's or the gateway's use case (``app.gateway.operate``, ``app.gateway.webhooks``) all or nothing."""
        kept, sent, audited = dict(self.kept), (list(self.pending), list(self.broadcasts)), list(self.audit_log)
        try:
            with self.store.transaction():
                return self.loop.run_until_complete(use_case(MemoryTransaction(self)))
        except BaseException:
            self.kept, self.audit_log = kept, audited
            self.pending[:], self.broadcasts[:] = sent
            raise

    def send(self, messages: Sequence[outbox.Message]) -> None:
        """What the relay would publish: wakeups to the workers' pending deliveries, the rest broadcast."""
        for message in messages:
            (self.pending if message.envelope.type == "run.wakeup" else self.broadcasts).append(message.envelope)

    # -- the gateway (app/gateway/webhooks.py) -------------------------------------------------------------------
    def receive_webhook(self, hook: Webhook) -> dict[str, Any]:
        return self.in_transaction(lambda tx: webhooks.intake(tx, PROVIDER, hook, {}, clock=self.clock))

    def unmatched_for(self, correlation_key: str) -> list[Webhook]:
        return [hook for hook, matched in self.kept.values()
                if matched is None and hook.correlation_key == correlation_key]

    # -- the operator (app/gateway/operate.py) ---------------------------------------------------------------------
    def operate(self, run_id: str, action: str, *, actor: str = "ops", reason: str = "test") -> dict[str, Any]:
        """An operator's cancel, pause, resume, retry or terminate; refused (``DomainError``) changes nothing."""
        if action == "terminate":
            done = self.in_transaction(lambda tx: operate.terminate(tx, run_id, actor=actor, reason=reason,
                                                                    clock=self.clock, kinds=self.kinds))
        else:
            use_case = {"cancel": operate.cancel, "pause": operate.pause, "resume": operate.resume,
                        "retry": operate.retry}[action]
            done = self.in_transaction(lambda tx: use_case(tx, run_id, actor=actor, reason=reason, clock=self.clock))
        # The scheduler's round that follows (on PostgreSQL it runs at least twice a second): a run the
        # operator ended gave its slot and its key back.
        self.admit(self.store.runs[run_id].tenant_id)
        return done

    def decide(self, run_id: str, *, approval_id: str, approved_hash: str, approved: bool = True,
               actor: str = "owner") -> dict[str, Any]:
        """The approver's decision on the request of ``approved_hash``."""
        return self.in_transaction(lambda tx: operate.decide_approval(
            tx, run_id, approval_id=approval_id, approved_hash=approved_hash, approved=approved, by=_person(actor),
            reason="decided", clock=self.clock))

    def answer(self, run_id: str, *, question_id: str, answer: object, actor: str = "operator") -> dict[str, Any]:
        """A person's answer to question ``question_id``, as the operator API takes it (``operate.answer``)."""
        return self.in_transaction(lambda tx: operate.answer(
            tx, run_id, question_id=question_id, answer=answer, by=_person(actor), reason="answered",
            clock=self.clock))

    def signal(self, run_id: str, *, name: str, payload: JsonValue, signal_id: str,
               actor: str = "ops") -> dict[str, Any]:
        """An operator's signal to the run, as the operator API takes it (``app.signals.send``)."""
        return self.in_transaction(lambda tx: signals.send(
            tx, run_id, signal_id=signal_id, name=name, payload=payload, sent_by=f"operator:{actor}", actor=actor,
            kinds=self.kinds, reason="signalled", clock=self.clock))

    # -- the reconciler (app/reconcile.py, app/reconcile_leases.py) ------------------------------------
    def rewake_expired_leases(self) -> int:
        return reconcile_store.rewake_expired_leases(self)

    def in_doubt(self) -> list[tuple[str, str]]:
        return reconcile_store.in_doubt(self)

    def reconcile_unknown(self) -> Counter[str]:
        return reconcile_store.reconcile_unknown(self)

    def clean_up(self) -> Counter[str]:
        """The cleanups of finished runs that are due (``app.reconciler.cleanup``)."""
        return cleanup_store.clean_up(self)

    def next_cleanup(self) -> float | None:
        """When the soonest cleanup not done is due, if any."""
        return cleanup_store.next_due(self)


def _person(name: str) -> Principal:
    """Who decides or answers in a test: an admin of every tenant with the subject ``name``, in the
    group it names when it is an owner ``group:<group>``."""
    group = name.removeprefix(GROUP_PREFIX)
    return Principal(name, frozenset({"admin"}), None, frozenset({group} if group != name else ()))
