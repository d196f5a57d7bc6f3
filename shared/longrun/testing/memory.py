"""In-memory ports: the store's contract without PostgreSQL, and the worker's step loop over it.

For property-based tests of the use cases. Nothing here replaces the runtime; it models it,
and a contract suite (``tests/integration/test_memory_contract.py``) runs the same calls
against ``longrun.db`` and this module and demands the same answers, so the model stays
honest.

- ``MemoryStore`` has the contract of ``db/runs.py`` + ``db/actions.py`` + ``db/inbox.py`` +
  ``db/timers.py``: one guarded write per transition (expected revision AND stored seq, plus
  lease owner and fencing token for a worker: ``LeaseLost`` when the fence no longer matches,
  else ``StaleRevision``, and nothing written); late events stored with ``applied=False``;
  leases that expire by a ``FakeClock`` (the database clock), a fencing token that grows on
  every takeover; an inbox claim that answers a repeat with the recorded outcome; one ledger
  row per idempotency key, refusing another request hash. ``transaction()`` gives the
  all-or-nothing of a database transaction. It reuses the pure ``runs.plan``.
- ``StepDriver`` applies ``app.advance.Advancer``'s rules (lease per wakeup, rounds of
  decide -> ledger -> evolve, commit with revision + fence, outcome recording that rebuilds on
  a concurrent append, cancellation) as a generator that stops at every point where the real
  worker could die or another writer could slip in: before and after each commit, and between
  the tool's answer and its recording.
- ``World`` is the rest of the ensemble in memory: the bus (pending and delivered wakeups), the
  scheduler's creation, the timer service, the gateway's webhook intake (inbox dedup, kept
  events matched when a wait starts), the operator API, and the reconciler's sweeps (expired
  leases, actions in doubt), with the same rules as ``app/timers.py``, ``app/webhooks.py``,
  ``app/operate.py`` and ``app/reconcile.py``.
- ``FarSide``: the external system, counting executions per idempotency key, with faults
  armed per call (unavailable, rejected, timeout after acting) and optional fencing by token.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

# The runtime's own rules where they are plain values, so the model cannot drift from them.
from longrun.app import reconcile
from longrun.app.advance import PARKED, UNAVAILABLE_RETRY_DELAY
from longrun.app.reconcile import ABANDONED_AFTER, ENDED_WHILE_SUBMITTED
from longrun.app.webhooks import WAITS
from longrun.authoring import ToolResult
from longrun.db.actions import LedgerRow
from longrun.db.inbox import Claimed, Duplicate
from longrun.db.runs import Fence, Found, Planned, StoredRun, plan
from longrun.db.timers import DueBatch, DueTimer, RunHead
from longrun.domain import (
    TERMINAL,
    UNRECONCILED,
    ActionStatus,
    AskModel,
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    Fail,
    FrozenMap,
    Reconcile,
    RecoveryPolicy,
    RunSnapshot,
    RunStatus,
    ScheduleRetry,
    WaitForEvent,
    WaitForUser,
    WakeReason,
    Workflow,
    evolve,
    budget_needs,
    exhausted,
    freeze,
    idempotency_key,
    is_late,
    recovery_policy,
    request_hash,
    thaw,
    wait_for,
)
from longrun.domain import events as ev
from longrun.errors import (
    ActionOutcomeUnknown,
    DomainError,
    ErrorCode,
    IdempotencyKeyReused,
    LeaseLost,
    StaleRevision,
    ToolRejected,
    ToolUnavailable,
)

_S = RunStatus
_A = ActionStatus
HELD = frozenset(RunStatus(s) for s in reconcile._HELD)
"""Open statuses an unreconciled action can hold a run in (``app.reconcile._HELD``)."""
WAKEABLE = reconcile._WAKEABLE
"""An expired lease of these gets a wakeup (``app.reconcile._WAKEABLE``)."""
MATCHABLE = WAITS | {_S.PAUSED}
"""As ``app.webhooks._match`` (statuses in its SQL): a webhook is delivered at once to a run in
these waiting on its key."""


class FakeClock:
    """Epoch seconds that move only when told: the database clock of leases and timers, and every writer's."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not go back")
        self.now += seconds


class NotPending(DomainError):
    """As ``app.operate.NotPending``: an operator decided something the run no longer asks for."""

    code = ErrorCode.ILLEGAL_TRANSITION

    def __init__(self, run_id: str, what: str) -> None:
        super().__init__(f"run {run_id}: {what} is not pending")


class UniqueViolation(Exception):
    """What PostgreSQL's unique constraints raise (the ledger's (run_id, logical_action))."""


# -- the store ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunRow:
    snapshot: RunSnapshot
    stored_seq: int
    partition: int
    lease_owner: str | None
    lease_until: float | None
    fencing_token: int
    admitted: bool
    tenant_id: str
    idempotency_key: str
    input_hash: str


@dataclass(frozen=True, slots=True)
class EventRow:
    event: ev.RunEvent
    applied: bool
    fencing_token: int | None


@dataclass(frozen=True, slots=True)
class ActionRow:
    action_id: str
    run_id: str
    logical_action: str
    tool: str
    tool_version: str
    effect_kind: str
    idempotency_key: str
    request_hash: str
    request: Mapping[str, Any]
    status: str
    attempts: int
    fencing_token: int
    external_id: str | None = None
    receipt: Mapping[str, Any] | None = None
    receipt_ref: str | None = None
    last_error: str | None = None
    created: int = 0
    """Insertion order (``created_at`` in the database)."""
    updated: float = 0.0
    """``updated_at``: the clock at the last write."""

    def ledger_row(self) -> LedgerRow:
        return LedgerRow(self.action_id, self.run_id, self.logical_action, self.tool, self.effect_kind,
                         self.idempotency_key, self.request_hash, dict(self.request), self.status, self.attempts,
                         self.external_id, None if self.receipt is None else dict(self.receipt))


_LEDGER_COLUMNS = frozenset({"attempts", "external_id", "receipt", "receipt_ref", "last_error", "fencing_token"})


@dataclass(frozen=True, slots=True)
class TimerRow:
    timer_key: str
    run_id: str
    kind: str
    wake_at: float
    payload: Mapping[str, Any]
    fired_at: float | None = None


@dataclass(frozen=True, slots=True)
class Write:
    """One successful worker write, with the lease as the store saw it (for the fencing invariant)."""

    run_id: str
    fence: Fence
    owner_at_write: str | None
    token_at_write: int


def _ts(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


class MemoryStore:
    """``db/runs.py`` + ``db/actions.py`` + ``db/inbox.py`` + ``db/timers.py`` over dicts of frozen rows."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.runs: dict[str, RunRow] = {}
        self.events: dict[str, tuple[EventRow, ...]] = {}
        self.actions: dict[str, ActionRow] = {}
        self.inbox: dict[tuple[str, str], dict[str, Any]] = {}
        self.timers: dict[str, TimerRow] = {}
        self.writes: tuple[Write, ...] = ()
        self._order = itertools.count(1)

    # -- transactions ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[MemoryStore]:
        """All or nothing: any exception restores every table as it was."""
        saved = (dict(self.runs), dict(self.events), dict(self.actions), dict(self.inbox), dict(self.timers),
                 self.writes)
        try:
            yield self
        except BaseException:
            self.runs, self.events, self.actions, self.inbox, self.timers, self.writes = (
                saved[0], saved[1], saved[2], saved[3], saved[4], saved[5])
            raise

    def tables(self) -> tuple[object, ...]:
        """Everything stored, for "nothing changed" assertions."""
        return (dict(self.runs), dict(self.events), dict(self.actions), dict(self.inbox), dict(self.timers))

    # -- runs (db/runs.py) -------------------------------------------------------------------------
    def _stored(self, row: RunRow) -> StoredRun:
        return StoredRun(row.snapshot, row.stored_seq, row.partition, row.lease_owner, _ts(row.lease_until),
                         row.fencing_token, row.admitted)

    def create(self, created: ev.RunCreated, *, idempotency_key: str, input_hash: str,
               partition: int) -> StoredRun | None:
        snapshot = evolve(None, created)
        if any(r.tenant_id == created.tenant_id and r.idempotency_key == idempotency_key for r in self.runs.values()):
            return None
        if created.run_id in self.runs:
            raise UniqueViolation(f"run {created.run_id} exists")
        self.runs[created.run_id] = RunRow(snapshot, created.seq, partition, None, None, 0, False,
                                           created.tenant_id, idempotency_key, input_hash)
        self.events[created.run_id] = (EventRow(created, True, None),)
        return StoredRun(snapshot, created.seq, partition, None, None, 0, admitted=False)

    def load(self, run_id: str) -> StoredRun | None:
        row = self.runs.get(run_id)
        return None if row is None else self._stored(row)

    def find(self, tenant_id: str, idempotency_key: str) -> Found | None:
        for run_id, row in self.runs.items():
            if row.tenant_id == tenant_id and row.idempotency_key == idempotency_key:
                run = row.snapshot
                return Found(run_id, row.input_hash, row.partition, run.kind, run.versions, dict(run.labels))
        return None

    def admit(self, run_id: str) -> None:
        self.runs[run_id] = replace(self.runs[run_id], admitted=True)

    def append(self, stored: StoredRun, events: Sequence[ev.RunEvent], *, fence: Fence | None = None,
               release_lease: bool = False) -> StoredRun:
        planned = plan(stored, events, release_lease=release_lease)
        run_id = stored.snapshot.run_id
        row = self.runs.get(run_id)
        ok = (row is not None and row.snapshot.revision == stored.snapshot.revision
              and row.stored_seq == stored.stored_seq)
        if ok and fence is not None:
            ok = row is not None and row.lease_owner == fence.owner and row.fencing_token == fence.token
        if not ok:
            if fence is not None and (row is None or row.lease_owner != fence.owner
                                      or row.fencing_token != fence.token):
                raise LeaseLost(run_id, fence.token)
            raise StaleRevision(run_id, stored.snapshot.revision)
        assert row is not None
        self._write(row, planned, fence)
        return planned.after

    def _write(self, row: RunRow, planned: Planned, fence: Fence | None) -> None:
        run_id = row.snapshot.run_id
        seqs = {e.event.seq for e in self.events[run_id]}
        for event, _ in planned.rows:
            if event.seq in seqs:
                raise UniqueViolation(f"run {run_id} already has an event at seq {event.seq}")
            seqs.add(event.seq)
        after = planned.after
        self.runs[run_id] = replace(
            row, snapshot=after.snapshot, stored_seq=after.stored_seq,
            lease_owner=None if planned.release_lease else row.lease_owner,
            lease_until=None if planned.release_lease else row.lease_until)
        self.events[run_id] = self.events[run_id] + tuple(
            EventRow(event, applied, fence.token if fence else None) for event, applied in planned.rows)
        if fence is not None:
            self.writes = (*self.writes, Write(run_id, fence, row.lease_owner, row.fencing_token))

    def write_many(self, planned: Sequence[Planned]) -> None:
        """Transitions of runs the caller holds (the timer's batch): the revision guard still applies."""
        for p in planned:
            row = self.runs.get(p.before.snapshot.run_id)
            if row is None or row.snapshot.revision != p.before.snapshot.revision \
                    or row.stored_seq != p.before.stored_seq:
                raise StaleRevision(p.before.snapshot.run_id, p.before.snapshot.revision)
            self._write(row, p, None)

    def history(self, run_id: str) -> list[ev.RunEvent]:
        return [r.event for r in sorted(self.events.get(run_id, ()), key=lambda r: r.event.seq)]

    def event_rows(self, run_id: str) -> tuple[EventRow, ...]:
        return self.events.get(run_id, ())

    def take_lease(self, run_id: str, owner: str, ttl: float) -> Fence | None:
        row = self.runs.get(run_id)
        if row is None:
            return None
        now = self.clock()
        if not (row.lease_owner is None or (row.lease_until is not None and row.lease_until < now)):
            return None
        token = row.fencing_token + 1
        self.runs[run_id] = replace(row, lease_owner=owner, lease_until=now + ttl, fencing_token=token)
        return Fence(owner, token)

    def extend_lease(self, run_id: str, fence: Fence, ttl: float) -> bool:
        row = self.runs.get(run_id)
        if row is None or row.lease_owner != fence.owner or row.fencing_token != fence.token:
            return False
        self.runs[run_id] = replace(row, lease_until=self.clock() + ttl)
        return True

    def release_lease(self, run_id: str, fence: Fence) -> None:
        row = self.runs.get(run_id)
        if row is not None and row.lease_owner == fence.owner and row.fencing_token == fence.token:
            self.runs[run_id] = replace(row, lease_owner=None, lease_until=None)

    def expired_leases(self) -> list[str]:
        now = self.clock()
        held = [(r.lease_until, run_id) for run_id, r in self.runs.items()
                if r.lease_owner is not None and r.lease_until is not None and r.lease_until < now]
        return [run_id for _, run_id in sorted(held)]

    def clear_lease(self, run_id: str) -> None:
        """The reconciler's clearing of an expired lease (no token change: the next take bumps it)."""
        self.runs[run_id] = replace(self.runs[run_id], lease_owner=None, lease_until=None)

    # -- the ledger (db/actions.py) -------------------------------------------------------------------
    def prepare(self, *, action_id: str, run_id: str, logical_action: str, tool: str, tool_version: str,
                effect_kind: str, idempotency_key: str, request_hash: str, request: Mapping[str, Any],
                fencing_token: int) -> None:
        existing = self.actions.get(idempotency_key)
        if existing is None:
            if any(a.run_id == run_id and a.logical_action == logical_action for a in self.actions.values()):
                raise UniqueViolation(f"run {run_id} already has a ledger row for {logical_action}")
            self.actions[idempotency_key] = ActionRow(
                action_id, run_id, logical_action, tool, tool_version, effect_kind, idempotency_key, request_hash,
                freeze(dict(request)), _A.SUBMITTED.value, 1, fencing_token, created=next(self._order),  # type: ignore[arg-type]
                updated=self.clock())
            return
        if existing.request_hash != request_hash:
            raise IdempotencyKeyReused(idempotency_key, existing.request_hash, request_hash)
        self.record(idempotency_key, _A.SUBMITTED, attempts=existing.attempts + 1, fencing_token=fencing_token)

    def record(self, idempotency_key: str, status: ActionStatus, **fields: Any) -> None:
        unknown = set(fields) - _LEDGER_COLUMNS
        if unknown:
            raise TypeError(f"no ledger column(s) {sorted(unknown)}")
        row = self.actions.get(idempotency_key)
        if row is not None:
            self.actions[idempotency_key] = replace(row, status=status.value, updated=self.clock(), **fields)

    def get(self, idempotency_key: str) -> LedgerRow | None:
        row = self.actions.get(idempotency_key)
        return None if row is None else row.ledger_row()

    def for_run(self, run_id: str) -> list[LedgerRow]:
        rows = sorted((a for a in self.actions.values() if a.run_id == run_id), key=lambda a: a.created)
        return [a.ledger_row() for a in rows]

    # -- inboxes (db/inbox.py) -------------------------------------------------------------------------
    def claim(self, service: str, *, message_id: str, message_type: str, run_id: str | None) -> Claimed | Duplicate:
        key = (service, message_id)
        if key in self.inbox:
            return Duplicate(message_id, dict(self.inbox[key]))
        self.inbox[key] = {}
        return Claimed(message_id)

    def record_outcome(self, service: str, *, message_id: str, outcome: dict[str, Any]) -> None:
        if (service, message_id) in self.inbox:
            self.inbox[(service, message_id)] = dict(outcome)

    # -- timers (db/timers.py) --------------------------------------------------------------------------
    def schedule(self, *, timer_key: str, run_id: str, kind: str, delay: float, payload: dict[str, Any]) -> None:
        if timer_key not in self.timers:
            self.timers[timer_key] = TimerRow(timer_key, run_id, kind, self.clock() + delay, dict(payload))

    def claim_due(self, *, limit: int) -> DueBatch | None:
        now = self.clock()
        rows = sorted((t for t in self.timers.values() if t.fired_at is None and t.wake_at <= now),
                      key=lambda t: (t.wake_at, t.timer_key))[:limit]
        if not rows:
            return None
        due = [DueTimer(t.timer_key, t.run_id, t.kind, _ts(t.wake_at), dict(t.payload)) for t in rows]  # type: ignore[arg-type]
        return DueBatch(_ts(now), due, {t.run_id: self._head(self.runs[t.run_id]) for t in rows})  # type: ignore[arg-type]

    @staticmethod
    def _head(row: RunRow) -> RunHead:
        run = row.snapshot
        return RunHead(run.run_id, run.tenant_id, row.partition, run.status.value, run.revision, row.stored_seq,
                       None if run.wait is None else run.wait.wait_id,
                       run.wait is not None and run.wait.wake_at is not None, run.stage, run.correlation_id,
                       dict(run.labels))

    def mark_fired(self, timer_keys: Sequence[str]) -> None:
        for key in timer_keys:
            if key in self.timers:
                self.timers[key] = replace(self.timers[key], fired_at=self.clock())

    def next_wake_at(self) -> float | None:
        pending = [t.wake_at for t in self.timers.values() if t.fired_at is None]
        return min(pending) if pending else None


# -- the far side -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What the runtime knows of a tool: name, version, effect kind (see ``authoring.Tool``)."""

    name: str
    version: str
    effect: EffectKind


FAULTS = ("ok", "unavailable", "rejected", "timeout_after_acting")


@dataclass
class FarSide:
    """The external system. ``executions`` counts what it did per (tool, idempotency key)."""

    fencing: bool = True
    """Refuse a request whose fencing token is lower than one already seen for its key."""
    executions: Counter[tuple[str, str]] = field(default_factory=Counter)
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    highest_token: dict[str, int] = field(default_factory=dict)
    armed: list[str] = field(default_factory=list)

    def arm(self, fault: str) -> None:
        assert fault in FAULTS
        self.armed.append(fault)

    def call(self, tool: ToolSpec, args: Mapping[str, Any], key: str, token: int) -> ToolResult:
        fault = self.armed.pop(0) if self.armed else "ok"
        if fault == "unavailable":
            raise ToolUnavailable(tool.name, "injected: nothing was done")
        if fault == "rejected":
            raise ToolRejected(tool.name, 422, "injected: refused")
        if self.fencing and token < self.highest_token.get(key, 0):
            raise ToolRejected(tool.name, 409, f"fencing token {token} is stale for {key}")
        self.highest_token[key] = max(token, self.highest_token.get(key, 0))
        self.executions[(tool.name, key)] += 1
        receipt = {"tool": tool.name, "key": key, **{k: v for k, v in thaw(args).items()}}  # type: ignore[union-attr]
        self.objects.setdefault(key, receipt)
        if fault == "timeout_after_acting":
            raise ActionOutcomeUnknown(tool.name, key, "injected: no answer after acting")
        return ToolResult(key, receipt)

    def lookup(self, key: str) -> ToolResult | None:
        found = self.objects.get(key)
        return None if found is None else ToolResult(key, found)


# -- workflows for the model ------------------------------------------------------------------------------

ECHO = ToolSpec("bench.echo", "1", EffectKind.PURE)
"""The ``steps`` workflow's tool (``longrun.workflows.steps.ECHO``)."""
PUBLISH = ToolSpec("probe.publish", "1", EffectKind.NON_IDEMPOTENT_WRITE)
GATED_KIND = "gated"
CI_TIMEOUT = 120.0
APPROVAL_TIMEOUT = 300.0
APPROVAL_ID = "release"


def ci_key(run_id: str) -> str:
    return f"ci/{run_id}"


def publish_args(state: RunSnapshot) -> dict[str, Any]:
    return {"run": state.run_id, "what": "release"}


def publish_hash(state: RunSnapshot) -> str:
    return request_hash(PUBLISH.name, PUBLISH.version, args=publish_args(state))


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
                return CallTool(tool=ECHO.name, logical_action=f"step:{i}", args=freeze({"step": i}))  # type: ignore[arg-type]
        deadline_passed = state.last_wake is not None and state.last_wake.reason is WakeReason.DEADLINE
        if state.fact(f"ci_result:{state.run_id}") is None:
            if deadline_passed:
                return Fail(reason="CI did not report before its deadline")
            return WaitForEvent(kind="ci", correlation_key=ci_key(state.run_id), deadline=ctx.now + CI_TIMEOUT)
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
            return CallTool(tool=PUBLISH.name, logical_action="publish", args=freeze(publish_args(state)),  # type: ignore[arg-type]
                            approval_id=APPROVAL_ID)
        return Complete(evidence=freeze({"steps": total, "published": True}))  # type: ignore[arg-type]

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        total = int(thaw(evidence)["steps"])  # type: ignore[index]
        unmet = [f"step:{i}" for i in range(total) if not _confirmed(state, f"step:{i}")]
        if not _confirmed(state, "publish"):
            unmet.append("publish")
        return tuple(unmet)


@dataclass(frozen=True)
class Kind:
    workflow: Workflow
    tools: Mapping[str, ToolSpec]


def kinds() -> dict[str, Kind]:
    from longrun.workflows.steps import Steps

    return {"steps": Kind(Steps(), {ECHO.name: ECHO}),
            GATED_KIND: Kind(Gated(), {ECHO.name: ECHO, PUBLISH.name: PUBLISH})}


# -- the worker's step loop -------------------------------------------------------------------------------

Steps = Generator[str, None, Any]
"""A step generator: yields the name of each point where it may stop (crash or be overtaken)."""


class StepDriver:
    """``Advancer``'s rules over the memory store; ``advance`` is a generator the test steps through."""

    def __init__(self, world: World, instance_id: str, *, lease_ttl: float) -> None:
        self.world = world
        self.store = world.store
        self.instance_id = instance_id
        self.lease_ttl = lease_ttl

    # -- bus side -------------------------------------------------------------------------------------
    def on_wakeup(self, message: Wakeup) -> tuple[dict[str, Any], bool]:
        """Inbox claim and lease in one transaction; (outcome, duplicate)."""
        with self.store.transaction():
            claim = self.store.claim("worker", message_id=message.message_id, message_type="run.wakeup",
                                     run_id=message.run_id)
            if isinstance(claim, Duplicate):
                return claim.outcome, True
            fence = self.store.take_lease(message.run_id, self.instance_id, self.lease_ttl)
            outcome = ({"taken": False, "reason": "another worker holds the lease"} if fence is None
                       else {"taken": True, "owner": fence.owner, "token": fence.token})
            self.store.record_outcome("worker", message_id=message.message_id, outcome=outcome)
        return outcome, False

    # -- the step loop ------------------------------------------------------------------------------------
    def advance(self, run_id: str, fence: Fence) -> Steps:
        try:
            stored = self._load(run_id, fence)
            while stored is not None:
                try:
                    stored = yield from self._round(stored, fence)
                except StaleRevision:
                    stored = self._load(run_id, fence)
        except LeaseLost:
            return "lease lost"
        return "done"

    def heartbeat(self, run_id: str, fence: Fence) -> bool:
        return self.store.extend_lease(run_id, fence, self.lease_ttl)

    def _load(self, run_id: str, fence: Fence) -> StoredRun | None:
        stored = self.store.load(run_id)
        if stored is None or stored.lease_owner != fence.owner or stored.fencing_token != fence.token:
            return None
        return stored

    def _round(self, stored: StoredRun, fence: Fence) -> Steps:
        run = stored.snapshot
        if run.status in TERMINAL or run.status in PARKED:
            yield from self._commit(stored, [], fence, release=True)
            return None
        if run.status is _S.READY:
            return (yield from self._commit(stored, [self._event(stored, ev.RunStatusChanged, to=_S.RUNNING,
                                                                 reason=f"taken by {fence.owner}")], fence))
        if run.status is _S.CANCELLING:
            return (yield from self._cancel(stored, fence))
        doubtful = [a.logical_action for a in run.actions if a.status in UNRECONCILED]
        if doubtful:
            yield from self._finish(stored, fence, ev.RunStatusChanged, to=_S.ACTION_UNKNOWN,
                                    reason=f"{', '.join(doubtful)} awaits reconciliation")
            return None
        kind = self.world.kinds[run.kind]
        ctx = self.world.context()
        decision = kind.workflow.decide(run, ctx)
        spent = exhausted(run.budget, budget_needs(decision, run))
        if spent is not None:
            yield from self._finish(stored, fence, ev.RunStatusChanged, to=_S.BUDGET_EXHAUSTED,
                                    reason=f"budget {spent} exhausted")
            return None
        if isinstance(decision, AskModel):
            raise NotImplementedError("the memory model has no model adapter")
        if isinstance(decision, CallTool):
            return (yield from self._call_tool(stored, fence, kind, decision))
        if isinstance(decision, (WaitForEvent, WaitForUser, ScheduleRetry)):
            status, wait = wait_for(decision, ctx)
            yield from self._finish(stored, fence, ev.WaitStarted, status=status, wait=wait)
            return None
        if isinstance(decision, Complete):
            unmet = kind.workflow.accept(run, decision.evidence)
            if unmet:
                yield from self._finish(stored, fence, ev.RunStatusChanged, to=_S.NEEDS_ATTENTION,
                                        reason="acceptance check failed: " + "; ".join(unmet))
                return None
            yield from self._finish(stored, fence, ev.RunCompleted, evidence=decision.evidence)
            return None
        if isinstance(decision, Fail):
            yield from self._finish(stored, fence, ev.RunStatusChanged, to=_S.FAILED, reason=decision.reason)
            return None
        assert isinstance(decision, Reconcile)
        yield from self._finish(stored, fence, ev.RunStatusChanged, to=_S.ACTION_UNKNOWN,
                                reason=f"{decision.logical_action} needs reconciliation")
        return None

    def _cancel(self, stored: StoredRun, fence: Fence) -> Steps:
        run = stored.snapshot
        for action in run.actions:
            if action.status is _A.SUBMITTED:
                return (yield from self._record_outcome(
                    stored, fence, action.idempotency_key, _A.UNKNOWN,
                    lambda s, a=action: [self._event(s, ev.ActionUnknown, logical_action=a.logical_action,
                                                     cause="cancelled while submitted; outcome not recorded")],
                    release=True))
            if action.status in UNRECONCILED:
                yield from self._commit(stored, [], fence, release=True)
                return None
        # The model's tools declare no compensation: nothing to undo.
        yield from self._finish(stored, fence, ev.RunStatusChanged, to=_S.CANCELLED,
                                reason="cancel requested; every action settled")
        return None

    def _finish(self, stored: StoredRun, fence: Fence, cls: type[ev.RunEvent], **fields: Any) -> Steps:
        yield from self._commit(stored, [self._event(stored, cls, **fields)], fence, release=True)

    def _call_tool(self, stored: StoredRun, fence: Fence, kind: Kind, decision: CallTool) -> Steps:
        run = stored.snapshot
        tool = kind.tools[decision.tool]
        args = dict(thaw(decision.args))  # type: ignore[call-overload]
        name = decision.logical_action
        record = run.action(name)
        key = record.idempotency_key if record else idempotency_key(run.run_id, name, attempt_scope=1)
        events: list[ev.RunEvent] = []
        if record is None:
            events.append(self._event(stored, ev.ActionPrepared, logical_action=name, tool=tool.name,
                                      tool_version=tool.version, effect_kind=tool.effect, idempotency_key=key,
                                      approval_id=decision.approval_id,
                                      request_hash=request_hash(tool.name, tool.version, args=args)))
        elif record.status is _A.SUBMITTED and recovery_policy(tool.effect) is RecoveryPolicy.RECONCILE:
            return (yield from self._record_outcome(stored, fence, key, _A.UNKNOWN, lambda s: [
                self._event(s, ev.ActionUnknown, logical_action=name,
                            cause="submitted before a crash; outcome not recorded"),
                *self._park_for_reconciliation(s, f"{name} needs reconciliation")]))
        elif record.status is not _A.SUBMITTED and record.status is not _A.RETRYABLE:
            yield from self._finish(stored, fence, ev.RunStatusChanged, to=_S.NEEDS_ATTENTION,
                                    reason=f"decide asked again for {name}, already {record.status.value}")
            return None
        if record is None or record.status is _A.RETRYABLE:
            events.append(self._event(stored, ev.ActionSubmitted, offset=len(events) + 1, logical_action=name))
            events.append(self._event(stored, ev.BudgetCharged, offset=len(events) + 1, tool_calls=1))
        if events:
            stored = yield from self._commit(stored, events, fence, ledger_row=(tool, name, key, args))
        try:
            result = self.world.far_side.call(tool, args, key, fence.token)
        except ActionOutcomeUnknown as e:
            cause = str(e)
            yield "tool answered"
            return (yield from self._record_outcome(stored, fence, key, _A.UNKNOWN, lambda s: [
                self._event(s, ev.ActionUnknown, logical_action=name, cause=cause),
                *self._park_for_reconciliation(s, f"{name}: outcome unknown ({cause})")], last_error=cause))
        except ToolUnavailable:
            yield "tool answered"
            status, wait = wait_for(ScheduleRetry(logical_action=name, delay=UNAVAILABLE_RETRY_DELAY),
                                    self.world.context())
            yield from self._finish(stored, fence, ev.WaitStarted, status=status, wait=wait)
            return None
        except ToolRejected as e:
            error = str(e)
            yield "tool answered"
            return (yield from self._record_outcome(stored, fence, key, _A.FAILED, lambda s: [
                self._event(s, ev.ActionFailed, logical_action=name, error=error)], last_error=error))
        yield "tool answered"
        receipt = dict(result.receipt)
        return (yield from self._record_outcome(stored, fence, key, _A.CONFIRMED, lambda s: [
            self._event(s, ev.ActionConfirmed, logical_action=name, external_id=result.external_id),
            self._event(s, ev.FactRecorded, offset=2, key=f"receipt:{name}", value=freeze(receipt),
                        source=f"tool:{tool.name}")], external_id=result.external_id, receipt=receipt))

    def _park_for_reconciliation(self, stored: StoredRun, reason: str) -> list[ev.RunEvent]:
        if stored.snapshot.status is not _S.RUNNING:
            return []
        return [self._event(stored, ev.RunStatusChanged, offset=2, to=_S.ACTION_UNKNOWN, reason=reason)]

    def _record_outcome(self, stored: StoredRun, fence: Fence, key: str, status: ActionStatus,
                        build: Callable[[StoredRun], list[ev.RunEvent]], *, release: bool = False,
                        **fields: Any) -> Steps:
        while True:
            events = build(stored)
            parked = release or any(isinstance(e, ev.RunStatusChanged) for e in events)
            yield "commit"
            try:
                with self.store.transaction():
                    after = self.store.append(stored, events, fence=fence, release_lease=parked)
                    self.store.record(key, status, **fields)
            except StaleRevision:
                reloaded = self._load(stored.snapshot.run_id, fence)
                if reloaded is None:
                    raise LeaseLost(stored.snapshot.run_id, fence.token) from None
                stored = reloaded
                continue
            return None if parked else after

    def _commit(self, stored: StoredRun, events: Sequence[ev.RunEvent], fence: Fence, *, release: bool = False,
                ledger_row: tuple[ToolSpec, str, str, dict[str, Any]] | None = None) -> Steps:
        yield "commit"
        with self.store.transaction():
            if not events:
                self.store.release_lease(stored.snapshot.run_id, fence)
                return stored
            after = self.store.append(stored, events, fence=fence, release_lease=release)
            if ledger_row is not None:
                tool, logical_action, key, args = ledger_row
                self.store.prepare(action_id=f"act-{key}", run_id=stored.snapshot.run_id,
                                   logical_action=logical_action, tool=tool.name, tool_version=tool.version,
                                   effect_kind=tool.effect.value, idempotency_key=key,
                                   request_hash=request_hash(tool.name, tool.version, args=args), request=args,
                                   fencing_token=fence.token)
            if release:
                self.world.schedule_wait_timers(after.snapshot, decided_at=events[-1].at)
                after = self.world.match_kept(after)
        yield "committed"
        return after

    def _event(self, stored: StoredRun, cls: type[ev.RunEvent], *, offset: int = 1, **fields: Any) -> ev.RunEvent:
        return cls(seq=stored.seq(offset), at=self.world.clock(), **fields)


# -- the rest of the ensemble ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Wakeup:
    message_id: str
    run_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Webhook:
    event_id: str
    correlation_key: str
    fact_key: str
    fact: Mapping[str, Any]


class World:
    """The ensemble around the workers, in memory: bus, scheduler, timers, gateway, operator, reconciler."""

    def __init__(self, *, far_side: FarSide | None = None, lease_ttl: float = 5.0) -> None:
        self.clock = FakeClock()
        self.store = MemoryStore(self.clock)
        self.far_side = far_side or FarSide()
        self.kinds = kinds()
        self.lease_ttl = lease_ttl
        self.pending: list[Wakeup] = []
        """Published wakeups not yet delivered."""
        self.delivered: list[Wakeup] = []
        """Delivered wakeups; the broker may deliver any of them again."""
        self.kept: dict[str, tuple[Webhook, str | None]] = {}
        """The gateway's webhook_events: event id -> (event, matched run)."""
        self._ids = itertools.count(1)

    def new_id(self, prefix: str = "id") -> str:
        return f"{prefix}-{next(self._ids)}"

    def context(self) -> DecisionContext:
        import random

        return DecisionContext(now=self.clock(), new_id=lambda: self.new_id("wait"), rng=random.Random(0))

    # -- effects (app/effects.py) ---------------------------------------------------------------------
    def wake(self, stored: StoredRun, reason: str) -> None:
        self.pending.append(Wakeup(self.new_id("wakeup"), stored.snapshot.run_id, reason))

    def schedule_wait_timers(self, run: RunSnapshot, *, decided_at: float) -> None:
        wait = run.wait
        if wait is None:
            return
        if wait.wake_at is not None:
            self.store.schedule(timer_key=f"{run.run_id}:{wait.wait_id}:wake", run_id=run.run_id,
                                kind="retry_backoff" if run.status is _S.RETRY_SCHEDULED else "sleep",
                                delay=wait.wake_at - decided_at, payload={"wait_id": wait.wait_id, "reason": "timer"})
        if wait.deadline is not None and wait.deadline != wait.wake_at:
            self.store.schedule(timer_key=f"{run.run_id}:{wait.wait_id}:deadline", run_id=run.run_id,
                                kind="wait_deadline", delay=wait.deadline - decided_at,
                                payload={"wait_id": wait.wait_id, "reason": "deadline"})

    # -- the scheduler (app/admit.py) ------------------------------------------------------------------
    def create(self, *, tenant_id: str, key: str, kind: str, goal: Mapping[str, Any],
               tool_calls: int = 50) -> str:
        from longrun.domain import PinnedVersions, Usage

        found = self.store.find(tenant_id, key)
        if found is not None:
            return found.run_id
        run_id = self.new_id("run")
        created = ev.RunCreated(seq=1, at=self.clock(), run_id=run_id, tenant_id=tenant_id, kind=kind,
                                goal=freeze(dict(goal)), budget=Usage(model_calls=5, tool_calls=tool_calls, cost=5.0),  # type: ignore[arg-type]
                                versions=PinnedVersions(workflow="1", prompt="none", model_policy="none",
                                                        tool_schemas="memory-v1"))
        with self.store.transaction():
            stored = self.store.create(created, idempotency_key=key, input_hash="h" * 64, partition=0)
            assert stored is not None
            self.store.admit(run_id)
            self.wake(stored, "admitted")
        return run_id

    # -- the timer service (app/timers.py, wait timers) -------------------------------------------------
    def fire_due_timers(self) -> int:
        with self.store.transaction():
            claimed = self.store.claim_due(limit=10_000)
            due = [] if claimed is None else claimed.timers
            marked: list[str] = []
            for timer in sorted(due, key=lambda t: (t.run_id, t.wake_at)):
                stored = self.store.load(timer.run_id)
                assert stored is not None
                wait_id, reason = timer.payload.get("wait_id"), timer.payload.get("reason")
                assert isinstance(wait_id, str) and reason in ("timer", "deadline"), timer
                event = ev.RunWoken(seq=stored.seq(1), at=self.clock(), wait_id=wait_id, reason=WakeReason(reason))
                try:
                    after = self.store.append(stored, [event])
                except DomainError:
                    marked.append(timer.timer_key)  # refused by the domain: skipped, and never again
                    continue
                if after.snapshot.revision != stored.snapshot.revision and after.snapshot.status is _S.READY:
                    self.wake(after, f"timer:{timer.kind}")
                marked.append(timer.timer_key)
            self.store.mark_fired(marked)
        return len(marked)

    # -- the gateway (app/webhooks.py) -------------------------------------------------------------------
    def receive_webhook(self, hook: Webhook) -> dict[str, Any]:
        with self.store.transaction():
            claim = self.store.claim("gateway", message_id=f"webhook:forge:{hook.event_id}",
                                     message_type="webhook.forge", run_id=None)
            if isinstance(claim, Duplicate):
                return {**claim.outcome, "duplicate": True}
            self.kept.setdefault(hook.event_id, (hook, None))
            run_id = self._match(hook)
            outcome = {"event_id": hook.event_id, "correlation_key": hook.correlation_key, "matched_run_id": run_id}
            self.store.record_outcome("gateway", message_id=f"webhook:forge:{hook.event_id}", outcome=outcome)
        return outcome

    def _match(self, hook: Webhook) -> str | None:
        for run_id, row in self.store.runs.items():
            wait = row.snapshot.wait
            if row.snapshot.status in MATCHABLE and wait is not None and wait.correlation_key == hook.correlation_key:
                stored = self.store.load(run_id)
                assert stored is not None
                self._deliver(stored, hook)
                return run_id
        return None

    def _deliver(self, stored: StoredRun, hook: Webhook) -> StoredRun:
        wait = stored.snapshot.wait
        assert wait is not None
        now = self.clock()
        after = self.store.append(stored, [
            ev.FactRecorded(seq=stored.seq(1), at=now, key=hook.fact_key, value=freeze(dict(hook.fact)),
                            source="webhook:forge"),
            ev.RunWoken(seq=stored.seq(2), at=now, wait_id=wait.wait_id, reason=WakeReason.EVENT,
                        correlation_key=hook.correlation_key)])
        self.kept[hook.event_id] = (hook, stored.snapshot.run_id)
        if after.snapshot.status is _S.READY:
            self.wake(after, f"webhook forge:{hook.event_id}")
        return after

    def match_kept(self, stored: StoredRun) -> StoredRun:
        wait = stored.snapshot.wait
        if stored.snapshot.status not in WAITS or wait is None or wait.correlation_key is None:
            return stored
        for hook, matched in self.kept.values():
            if matched is None and hook.correlation_key == wait.correlation_key:
                return self._deliver(stored, hook)
        return stored

    def unmatched_for(self, correlation_key: str) -> list[Webhook]:
        return [hook for hook, matched in self.kept.values()
                if matched is None and hook.correlation_key == correlation_key]

    # -- the operator (app/operate.py) ---------------------------------------------------------------------
    def operate(self, run_id: str, build: Callable[[int, float], ev.RunEvent]) -> RunSnapshot:
        """Lock, append, wake when the run has work; a refused event raises and changes nothing.
        A decision on something the run no longer asks for is refused (``NotPending``), not stored as late."""
        with self.store.transaction():
            stored = self.store.load(run_id)
            assert stored is not None
            event = build(stored.seq(), self.clock())
            if is_late(stored.snapshot, event):
                raise NotPending(run_id, event.type)
            after = self.store.append(stored, [event])
            if after.snapshot.status in (_S.READY, _S.CANCELLING):
                self.wake(after, "operator")
        return after.snapshot

    # -- the reconciler (app/reconcile.py) ---------------------------------------------------------------
    def rewake_expired_leases(self) -> int:
        woken = 0
        for run_id in self.store.expired_leases():
            with self.store.transaction():
                self.store.clear_lease(run_id)
                stored = self.store.load(run_id)
                assert stored is not None
                if stored.snapshot.status in WAKEABLE:
                    self.wake(stored, "lease expired")
                    woken += 1
        return woken

    def in_doubt(self) -> list[tuple[str, str]]:
        """As ``app.reconcile._in_doubt``: ledger rows UNKNOWN; held runs listing an UNKNOWN action;
        and ledger rows still SUBMITTED under a finished run once ``ABANDONED_AFTER`` passed (no
        worker will ever record what became of them)."""
        now = self.clock()
        rows = sorted(self.store.actions.values(), key=lambda a: a.updated)
        found = [(a.run_id, a.logical_action) for a in rows if a.status == _A.UNKNOWN.value]
        for run_id, row in self.store.runs.items():
            if row.snapshot.status in HELD:
                found += [(run_id, a.logical_action) for a in row.snapshot.actions if a.status is _A.UNKNOWN]
        found += [(a.run_id, a.logical_action) for a in rows
                  if a.status == _A.SUBMITTED.value and self.store.runs[a.run_id].snapshot.status in TERMINAL
                  and a.updated < now - ABANDONED_AFTER]
        return list(dict.fromkeys(found))

    def reconcile_unknown(self) -> Counter[str]:
        """Claim (RECONCILING), ask the far side by key, record the verdict; as ``reconcile_unknown``."""
        tally: Counter[str] = Counter()
        for run_id, logical_action in self.in_doubt():
            claimed = self._claim(run_id, logical_action)
            if claimed is None:
                continue
            key, started_seq = claimed
            tool = self.store.actions[key].tool
            # steps.ECHO declares no lookup: a pure step re-runs safely, so the verdict is RETRYABLE
            # (``app.reconcile._without_lookup``) whatever happened.
            found = None if tool == ECHO.name else self.far_side.lookup(key)
            outcome = _A.CONFIRMED if found is not None else _A.RETRYABLE
            self._settle(run_id, logical_action, key, started_seq, outcome, found)
            tally[outcome.value] += 1
        return tally

    def _claim(self, run_id: str, logical_action: str) -> tuple[str, int] | None:
        with self.store.transaction():
            stored = self.store.load(run_id)
            row = next((a for a in self.store.actions.values()
                        if a.run_id == run_id and a.logical_action == logical_action), None)
            if stored is None or row is None:
                return None
            record = stored.snapshot.action(logical_action)
            finished = stored.snapshot.status in TERMINAL
            status = _A(row.status) if finished or record is None else record.status
            at = self.clock()
            events: list[ev.RunEvent] = []
            if status is _A.SUBMITTED and finished and row.updated < at - ABANDONED_AFTER:
                events.append(ev.ActionUnknown(seq=stored.seq(1), at=at, logical_action=logical_action,
                                               cause=ENDED_WHILE_SUBMITTED))
            elif status is not _A.UNKNOWN:
                return None
            events.append(ev.ReconciliationStarted(seq=stored.seq(len(events) + 1), at=at,
                                                   logical_action=logical_action))
            self.store.append(stored, events)
            self.store.record(row.idempotency_key, _A.RECONCILING, last_error=None)
            return row.idempotency_key, events[-1].seq

    def _settle(self, run_id: str, logical_action: str, key: str, started_seq: int, outcome: ActionStatus,
                found: ToolResult | None) -> None:
        with self.store.transaction():
            stored = self.store.load(run_id)
            assert stored is not None
            latest = max((r.event.seq for r in self.store.event_rows(run_id)
                          if isinstance(r.event, ev.ReconciliationStarted)
                          and r.event.logical_action == logical_action), default=None)
            if latest != started_seq or self.store.actions[key].status != _A.RECONCILING.value:
                return
            at = self.clock()
            events: list[ev.RunEvent] = [ev.ActionReconciled(
                seq=stored.seq(1), at=at, logical_action=logical_action, outcome=outcome,
                external_id=found.external_id if found else None, note="found by idempotency key" if found
                else "nothing exists under the idempotency key; resubmitting under it is safe")]
            if found is not None:
                events.append(ev.FactRecorded(seq=stored.seq(2), at=at, key=f"receipt:{logical_action}",
                                              value=freeze(dict(found.receipt)), source="tool:reconciled"))
            after = self.store.append(stored, events)
            fields: dict[str, Any] = {"last_error": None}
            if found is not None:
                fields.update(external_id=found.external_id, receipt=dict(found.receipt))
            self.store.record(key, outcome, **fields)
            if after.snapshot.status in (_S.READY, _S.CANCELLING):
                self.wake(after, f"reconciled {logical_action}")
