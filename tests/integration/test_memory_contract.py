"""The in-memory adapters keep the real ones' contract: same calls, same answers, same refusals.

``longrun.testing.memory.MemoryStore`` and the worker's port over it
(``longrun.testing.workers.MemoryWorkerStore``) stand in for PostgreSQL in the property tests and
in run kinds' own tests. Each scenario here is one sequence of calls (``db/runs.py``,
``db/actions.py``, ``db/inbox.py``, ``db/timers.py``, and the worker's ``ports.stores.WorkerStore``),
run once against PostgreSQL (each ``db`` call its own transaction; ``db.worker_store``) and once
in memory; what every call returned or raised is recorded, normalised (ids, clocks) and must be
identical. A divergence means the model the tests trust has drifted from the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, is_dataclass, replace
from typing import Any, Protocol

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.app import effects
from longrun.app.gateway import operate, webhooks
from longrun.app.reconciler import cleanup as cleanup_sweep
from longrun.app.reconciler import leases as lease_sweep
from longrun.app.reconciler import settle
from longrun.app.scheduler import admit
from longrun.app.worker.loop import Worker
from longrun.artifacts import FilesystemArtifactStore
from longrun.authoring import CleanupStep, Registry, RunKind, ToolResult, pins_key
from longrun.db import actions as ledger
from longrun.db import inbox, outbox, runs, timers
from longrun.db import leases
from longrun.db.driver import Pool
from longrun.db.cleanups import PgCleanupStore
from longrun.db.reconcile_store import PgReconcileStore
from longrun.db.transaction import PgTransaction
from longrun.db.worker_store import PgWorkerStore
from longrun.domain import (
    ActionStatus,
    EffectKind,
    PinnedVersions,
    RetryPolicy,
    RunStatus,
    Usage,
    Wait,
    WakeReason,
    calls,
    event_to_dict,
    freeze,
)
from longrun.domain import events as ev
from longrun.domain.breaker import health_wait
from longrun.envelope import make
from longrun.errors import ToolUnavailable
from longrun.model import ScriptedModel
from longrun.ports.runs import (Fence, Handover, LedgerOutcome, LedgerRequest, Rides, StoredRun, Transition,
                                plan)
from longrun.ports.timers import DueTimer
from longrun.principals import Principal
from longrun.testing.checkpoints import CrashAt, Crashed
from longrun.testing.cleanup_store import MemoryCleanupStore
from longrun.testing.reconcile_store import MemoryReconcileStore
from longrun.testing.transaction import MemoryTransaction
from longrun.testing.workers import MemoryArtifacts, MemoryWorkerStore
from longrun.testing.world import World
from longrun.workflows.steps import ECHO, Steps
from longrun_dependency_upgrade.webhooks import forge
from tests import ci_gate

pytestmark = pytest.mark.integration

USE_CASES = {"admit": admit, "operate": operate, "webhooks": webhooks}
"""Called with a ``RunTransaction`` of the port's store, each call a transaction of its own."""
SWEEPS = {"settle": settle, "lease_sweep": lease_sweep}
"""Called with a ``ReconcileStore`` of the port's store: each sweep runs its transactions itself."""
VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="contract-v1")
SERVED = frozenset({pins_key("steps", VERSIONS)})
"""What the scenarios' workers run: the runs they create."""
TTL = 0.4
"""Lease seconds: short, because the real store's clock is PostgreSQL's and the test sleeps for real."""


def _sent(envelopes: Iterable[Mapping[str, Any]], prefix: str) -> list[tuple[str, str, Any]]:
    """Messages sent about the port's runs, in an order both stores agree on: type, run, reason or status."""
    return sorted((e["type"], e["run_id"], e["payload"].get("reason", e["payload"].get("status")))
                  for e in envelopes if str(e["run_id"]).startswith(prefix))


class Port(Protocol):
    prefix: str

    def now(self) -> float: ...
    async def sleep(self, seconds: float) -> None: ...
    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any: ...


class Real:
    """``longrun.db`` over PostgreSQL: every call in its own transaction; ``worker.*``: the worker's store."""

    def __init__(self, engine: AsyncEngine, statements: Pool, artifacts: FilesystemArtifactStore) -> None:
        self.engine = engine
        self.worker = PgWorkerStore(engine=engine, statements=statements, artifacts=artifacts,
                                    match_kept=webhooks.match_kept)
        self.prefix = f"pg{uuid.uuid4().hex[:6]}"

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        module, function = name.split(".")
        if module == "worker":
            return await getattr(self.worker, function)(*args, **kwargs)
        if module in USE_CASES:
            async with self.engine.begin() as conn:
                return await getattr(USE_CASES[module], function)(PgTransaction(conn), *args, **kwargs)
        if module in SWEEPS:
            return await getattr(SWEEPS[module], function)(PgReconcileStore(self.engine), *args, **kwargs)
        if module == "cleanup_sweep":
            return await getattr(cleanup_sweep, function)(PgCleanupStore(self.engine), *args, **kwargs)
        if name == "cleanups.row":
            async with self.engine.connect() as conn:
                row = (await conn.execute(text("SELECT attempts, alerted, done_at, last_error FROM cleanups "
                                               "WHERE run_id = :r"), {"r": args[0]})).first()
            return None if row is None else _cleanup_row(row.attempts, row.alerted, row.done_at, row.last_error)
        if name == "audit.alerts":
            async with self.engine.connect() as conn:
                rows = await conn.execute(text("SELECT action, details FROM audit_log WHERE target = :r "
                                               "AND action LIKE 'alert.%' ORDER BY id"), {"r": args[0]})
                return [(r.action, r.details) for r in rows]
        if name == "limits.own_slots":
            async with self.engine.begin() as conn:
                await conn.execute(text("INSERT INTO tenant_limits (tenant_id, version, run_slots, updated_by) "
                                        "VALUES (:t, 1, :n, 'contract')"), {"t": args[0], "n": args[1]})
            return None
        if name == "outbox.sent":
            async with self.engine.connect() as conn:
                rows = await conn.execute(text("SELECT type, payload FROM outbox"))
                return _sent([outbox.envelope_of(r.type, r.payload) for r in rows], self.prefix)
        if name == "runs.admit":  # what admission's statements do to a run they admit
            async with self.engine.begin() as conn:
                await conn.execute(text("UPDATE runs SET admitted_at = now() WHERE run_id = :r"), {"r": args[0]})
            return None
        target = {"runs": runs, "leases": leases, "ledger": ledger, "inbox": inbox, "timers": timers}[module]
        async with self.engine.begin() as conn:
            return await getattr(target, function)(conn, *args, **kwargs)


class Memory:
    def __init__(self) -> None:
        self.world = World()
        self.clock = self.world.clock
        self.clock.now = time.time()
        self.store = self.world.store
        self.worker = MemoryWorkerStore(self.world)
        self.prefix = f"mem{uuid.uuid4().hex[:6]}"

    def now(self) -> float:
        return self.clock()

    async def sleep(self, seconds: float) -> None:
        self.clock.advance(seconds)

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        module, function = name.split(".")
        if module == "worker":
            return await getattr(self.worker, function)(*args, **kwargs)
        if module in USE_CASES:
            with self.store.transaction():
                return await getattr(USE_CASES[module], function)(MemoryTransaction(self.world), *args, **kwargs)
        if module in SWEEPS:
            return await getattr(SWEEPS[module], function)(MemoryReconcileStore(self.world), *args, **kwargs)
        if module == "cleanup_sweep":
            return await getattr(cleanup_sweep, function)(MemoryCleanupStore(self.world), *args, **kwargs)
        if name == "cleanups.row":
            found = self.store.cleanups.get(args[0])
            return None if found is None else _cleanup_row(found.attempts, found.alerted, found.done_at,
                                                            found.last_error)
        if name == "audit.alerts":
            return [(a["action"], a["details"]) for a in self.world.audit_log
                    if a["target"] == args[0] and a["action"].startswith("alert.")]
        if name == "limits.own_slots":
            self.world.tenant_slots[args[0]] = args[1]
            return None
        if name == "outbox.sent":
            sent = (*self.world.pending, *self.world.broadcasts)
            return _sent((e.model_dump(mode="json") for e in sent), self.prefix)
        if (module, function) == ("runs", "load"):
            kwargs.pop("lock", None)
        with self.store.transaction():
            return getattr(self.store, function)(*args, **kwargs)


Scenario = Callable[[Port, list[Any]], Awaitable[None]]


async def observe(port: Port, seen: list[Any], name: str, *args: Any, **kwargs: Any) -> Any:
    """Call, record the answer or the refusal (its type), and return the answer (None if refused)."""
    try:
        answer = await port.call(name, *args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the refusal is the observation
        refused = "UniqueViolation" if isinstance(e, IntegrityError) else type(e).__name__
        seen.append((name, "raised", refused))
        return None
    seen.append((name, _plain(answer)))
    return answer


def _plain(value: Any) -> Any:
    if isinstance(value, inbox.Handled):  # its row is the statement's own
        return {"outcome": value.outcome, "duplicate": value.duplicate}
    if isinstance(value, admit.Answered):  # its envelope's ids and time are each call's own
        payload = value.answer.payload.model_dump(mode="json")
        payload.pop("refused_event_id", None)  # the create's own id, drawn afresh for each store
        return {"outcome": value.outcome, "answered": value.answer.type, "payload": payload}
    if isinstance(value, StoredRun):
        return {"snapshot": value.snapshot.to_dict(), "stored_seq": value.stored_seq, "partition": value.partition,
                "lease_owner": value.lease_owner, "leased": value.lease_until is not None,
                "fencing_token": value.fencing_token, "admitted": value.admitted}
    if isinstance(value, ev.RunEvent):
        return event_to_dict(value)
    if isinstance(value, timers.DueBatch):  # its ``now`` is each store's own clock
        return {"timers": _plain(value.timers), "heads": {k: _plain(v) for k, v in value.heads.items()}}
    if isinstance(value, ledger.LedgerRow):  # its heartbeat's time is each store's own clock
        return {**asdict(value), "heartbeat_at": value.heartbeat_at is not None}
    if isinstance(value, DueTimer):
        return {"timer_key": value.timer_key, "run_id": value.run_id, "kind": value.kind, "payload": value.payload}
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def created(port: Port, name: str, *, at: float) -> ev.RunCreated:
    return ev.RunCreated(seq=1, at=at, run_id=f"{port.prefix}-{name}", tenant_id=port.prefix, kind="steps",
                         goal=freeze({"steps": 2}), versions=VERSIONS,  # type: ignore[arg-type]
                         budget=Usage(model_calls=1, tool_calls=5, cost=1.0))


async def new_run(port: Port, seen: list[Any], name: str = "r1", *, admitted: bool = True) -> StoredRun:
    """A created run, admitted (as admission does before it wakes one) unless ``admitted`` is False."""
    stored = await observe(port, seen, "runs.create", created(port, name, at=1000.0),
                           idempotency_key=f"key-{name}", input_hash="h" * 64, partition=3)
    assert stored is not None
    if admitted:
        await observe(port, seen, "runs.admit", stored.snapshot.run_id)
        stored = replace(stored, admitted=True)
    return stored  # type: ignore[no-any-return]


# -- scenarios ------------------------------------------------------------------------------------


async def creation_is_idempotent_per_tenant_and_key(port: Port, seen: list[Any]) -> None:
    await new_run(port, seen)
    # The same (tenant, key) again, for another run id: no second run.
    await observe(port, seen, "runs.create", created(port, "r2", at=1001.0), idempotency_key="key-r1",
                  input_hash="i" * 64, partition=3)
    await observe(port, seen, "runs.find", port.prefix, "key-r1")
    await observe(port, seen, "runs.find", port.prefix, "key-none")
    await observe(port, seen, "runs.load", f"{port.prefix}-r1")
    await observe(port, seen, "runs.load", f"{port.prefix}-r2")
    await observe(port, seen, "runs.history", f"{port.prefix}-r1")


async def appends_are_guarded_by_revision_and_stored_seq(port: Port, seen: list[Any]) -> None:
    stored = await new_run(port, seen)
    take = ev.RunStatusChanged(seq=2, at=1001.0, to=RunStatus.RUNNING, reason="taken")
    after = await observe(port, seen, "runs.append", stored, [take])
    # The same expected revision again: someone moved first.
    await observe(port, seen, "runs.append", stored, [ev.RunStatusChanged(seq=2, at=1002.0, to=RunStatus.FAILED,
                                                                          reason="late writer")])
    # An event the domain refuses: nothing is written either.
    await observe(port, seen, "runs.append", after, [ev.RunStatusChanged(seq=3, at=1002.0, to=RunStatus.WAITING_USER,
                                                                         reason="no wait")])
    await observe(port, seen, "runs.append", after, [ev.RunCompleted(seq=3, at=1003.0, evidence=freeze({}))])
    await observe(port, seen, "runs.load", stored.snapshot.run_id)
    await observe(port, seen, "runs.history", stored.snapshot.run_id)


async def late_events_are_stored_not_applied(port: Port, seen: list[Any]) -> None:
    stored = await new_run(port, seen)
    wait = Wait(wait_id="w1", kind="ci", deadline=5000.0, correlation_key="ci/1")
    after = await observe(port, seen, "runs.append", stored, [
        ev.RunStatusChanged(seq=2, at=1001.0, to=RunStatus.RUNNING, reason="taken"),
        ev.WaitStarted(seq=3, at=1001.0, status=RunStatus.WAITING_EVENT, wait=wait)], release_lease=True)
    woken = await observe(port, seen, "runs.append", after, [
        ev.RunWoken(seq=4, at=1002.0, wait_id="w1", reason=WakeReason.EVENT, correlation_key="ci/1")])
    # The deadline timer fires for a wait that already ended: stored, revision unchanged, seq advances.
    await observe(port, seen, "runs.append", woken, [ev.RunWoken(seq=5, at=1003.0, wait_id="w1",
                                                                 reason=WakeReason.DEADLINE)])
    await observe(port, seen, "runs.load", stored.snapshot.run_id)
    await observe(port, seen, "runs.history", stored.snapshot.run_id)


async def leases_fence_stale_workers(port: Port, seen: list[Any]) -> None:
    stored = await new_run(port, seen)
    run_id = stored.snapshot.run_id
    old = await observe(port, seen, "leases.take_lease", run_id, "w-old", TTL)
    await observe(port, seen, "leases.take_lease", run_id, "w-new", TTL)  # live: refused
    await observe(port, seen, "leases.extend_lease", run_id, old, TTL)
    await port.sleep(TTL * 2.5)
    new = await observe(port, seen, "leases.take_lease", run_id, "w-new", 30)
    current = await observe(port, seen, "runs.load", run_id)
    take = [ev.RunStatusChanged(seq=2, at=1001.0, to=RunStatus.RUNNING, reason="taken")]
    await observe(port, seen, "runs.append", current, take, fence=old)  # stale: LeaseLost
    await observe(port, seen, "leases.extend_lease", run_id, old, TTL)
    await observe(port, seen, "leases.release_lease", run_id, old)  # a no-op for a stale fence
    await observe(port, seen, "runs.load", run_id)
    await observe(port, seen, "runs.append", current, take, fence=new)
    await observe(port, seen, "runs.append", current, take, fence=new)  # the same revision twice: stale
    await observe(port, seen, "leases.release_lease", run_id, new)
    after = await observe(port, seen, "runs.load", run_id)
    yielded = [ev.RunStatusChanged(seq=3, at=1002.0, to=RunStatus.READY, reason="yield")]
    await observe(port, seen, "runs.append", after, yielded, fence=new)  # released: the fence is gone
    await observe(port, seen, "leases.take_lease", run_id, "w-third", 30)  # the token grows on every takeover
    await observe(port, seen, "runs.append", after, yielded, fence=Fence("w-third", 3), release_lease=True)
    await observe(port, seen, "runs.load", run_id)
    await observe(port, seen, "leases.take_lease", f"{port.prefix}-ghost", "w", 30)


async def one_ledger_row_per_idempotency_key(port: Port, seen: list[Any]) -> None:
    stored = await new_run(port, seen)
    run_id = stored.snapshot.run_id
    row = {"action_id": f"{port.prefix}-a1", "run_id": run_id, "logical_action": "step:0", "tool": "bench.echo",
           "tool_version": "1", "effect_kind": EffectKind.PURE.value, "idempotency_key": f"{port.prefix}-k1",
           "request_hash": "a" * 64, "request": {"step": 0}, "fencing_token": 1}
    await observe(port, seen, "ledger.prepare", **row)
    await observe(port, seen, "ledger.get", f"{port.prefix}-k1")
    await observe(port, seen, "ledger.prepare", **{**row, "action_id": f"{port.prefix}-a2", "fencing_token": 2})
    await observe(port, seen, "ledger.prepare", **{**row, "request_hash": "b" * 64})  # another request: refused
    await observe(port, seen, "ledger.record", f"{port.prefix}-k1", ActionStatus.CONFIRMED, external_id="x-1",
                  receipt={"step": 0})
    await observe(port, seen, "ledger.record", f"{port.prefix}-nothing", ActionStatus.CONFIRMED)  # no row: no-op
    second = {**row, "action_id": f"{port.prefix}-a3", "logical_action": "step:1",
              "idempotency_key": f"{port.prefix}-k2", "request": {"step": 1}}
    await observe(port, seen, "ledger.prepare", **second)
    await observe(port, seen, "ledger.prepare", **{**second, "action_id": f"{port.prefix}-a4",
                                                   "idempotency_key": f"{port.prefix}-k3"})  # same action, new key
    await observe(port, seen, "ledger.for_run", run_id)
    await observe(port, seen, "ledger.get", f"{port.prefix}-none")


async def inbox_answers_a_repeat_with_the_recorded_outcome(port: Port, seen: list[Any]) -> None:
    message = f"{port.prefix}-m1"
    await observe(port, seen, "inbox.claim", "worker", message_id=message, message_type="run.wakeup", run_id=None)
    await observe(port, seen, "inbox.record_outcome", "worker", message_id=message, outcome={"taken": True})
    await observe(port, seen, "inbox.claim", "worker", message_id=message, message_type="run.wakeup", run_id=None)
    await observe(port, seen, "inbox.claim", "gateway", message_id=message, message_type="x", run_id=None)
    await observe(port, seen, "inbox.claim", "gateway", message_id=message, message_type="x", run_id=None)


async def timers_fire_once_when_due(port: Port, seen: list[Any]) -> None:
    stored = await new_run(port, seen)
    run_id = stored.snapshot.run_id
    soon, later = TTL, 3600.0
    for key, kind, delay in ((f"{run_id}:w:deadline", "wait_deadline", soon), (f"{run_id}:w:wake", "sleep", later)):
        await observe(port, seen, "timers.schedule", timer_key=key, run_id=run_id, kind=kind, delay=delay,
                      payload={"wait_id": "w", "reason": "deadline"})
    await observe(port, seen, "timers.claim_due", limit=10)
    await port.sleep(TTL * 2.5)
    due = await observe(port, seen, "timers.claim_due", limit=10)
    # Scheduling the same key again changes nothing; marking fires it for good.
    await observe(port, seen, "timers.schedule", timer_key=f"{run_id}:w:deadline", run_id=run_id,
                  kind="wait_deadline", delay=later, payload={"other": True})
    await observe(port, seen, "timers.claim_due", limit=10)
    await observe(port, seen, "timers.mark_fired", [t.timer_key for t in due.timers] if due else [])
    await observe(port, seen, "timers.claim_due", limit=10)


# -- the worker's store (ports.stores.WorkerStore) ------------------------------------------------------


def _wakeup(port: Port, name: str, run_id: str) -> inbox.Message:
    return inbox.Message(f"{port.prefix}-{name}", "run.wakeup", run_id)


def _request(port: Port, run_id: str, fence: Fence, *, step: int = 0, hash_: str = "a" * 64) -> LedgerRequest:
    """A ledger request under ``fence``, as the worker makes one."""
    return LedgerRequest(action_id=f"{port.prefix}-a{step}-{hash_[0]}-{fence.token}", run_id=run_id,
                         logical_action=f"step:{step}", tool="bench.echo", tool_version="1",
                         effect_kind=EffectKind.PURE.value, idempotency_key=f"{port.prefix}-k{step}",
                         request_hash=hash_, request={"step": step}, fencing_token=fence.token)


async def _taken(port: Port, seen: list[Any], stored: StoredRun, owner: str) -> Fence:
    handled, _ = await observe(port, seen, "worker.take_on_wakeup", _wakeup(port, owner, stored.snapshot.run_id),
                               owner, 30, SERVED)
    return Fence(handled.outcome["owner"], handled.outcome["token"])


async def a_queued_run_is_taken_on_no_wakeup_until_admitted(port: Port, seen: list[Any]) -> None:
    run_id = (await new_run(port, seen, admitted=False)).snapshot.run_id
    await observe(port, seen, "worker.take_on_wakeup", _wakeup(port, "m1", run_id), "w1", 30, SERVED)
    await observe(port, seen, "worker.adopt", "w1", 30, SERVED, 10)
    await observe(port, seen, "runs.admit", run_id)
    await observe(port, seen, "worker.take_on_wakeup", _wakeup(port, "m2", run_id), "w1", 30, SERVED)


async def a_wakeup_takes_the_lease_once(port: Port, seen: list[Any]) -> None:
    stored = await new_run(port, seen)
    run_id = stored.snapshot.run_id
    await observe(port, seen, "worker.take_on_wakeup", _wakeup(port, "m1", run_id), "w1", 30, SERVED)
    await observe(port, seen, "worker.take_on_wakeup", _wakeup(port, "m1", run_id), "w2", 30, SERVED)  # a repeat
    await observe(port, seen, "worker.take_on_wakeup", _wakeup(port, "m2", run_id), "w2", 30, SERVED)  # held: not taken
    fence = Fence("w1", 1)
    await observe(port, seen, "worker.extend_lease", run_id, fence, 30)
    await observe(port, seen, "worker.extend_lease", run_id, Fence("w2", 1), 30)
    await observe(port, seen, "worker.release_lease", run_id, fence)
    await observe(port, seen, "worker.take_on_wakeup", _wakeup(port, "m3", run_id), "w2", 30, SERVED)  # token 2
    await observe(port, seen, "worker.load", run_id)
    await observe(port, seen, "worker.take_on_wakeup", _wakeup(port, "m4", f"{port.prefix}-ghost"), "w2", 30, SERVED)


async def a_run_not_served_waits_for_a_worker_that_runs_it(port: Port, seen: list[Any]) -> None:
    run_id = (await new_run(port, seen)).snapshot.run_id
    version_2 = frozenset({pins_key("steps", replace(VERSIONS, workflow="2"))})
    await observe(port, seen, "worker.adopt", "w1", 30, SERVED, 10)  # nothing waits
    await observe(port, seen, "worker.take_on_wakeup", _wakeup(port, "m1", run_id), "w2", 30, version_2)  # declined
    await observe(port, seen, "worker.take_on_wakeup", _wakeup(port, "m2", run_id), "w2", 30, version_2)  # again
    await observe(port, seen, "worker.adopt", "w2", 30, version_2, 10)  # not by a worker that cannot run it
    adopted = await observe(port, seen, "worker.adopt", "w1", 30, SERVED, 10)  # taken over once
    await observe(port, seen, "worker.adopt", "w3", 30, SERVED, 10)
    await observe(port, seen, "worker.hand_over", run_id, Fence("w1", adopted[0].fencing_token))
    await observe(port, seen, "worker.load", run_id)  # released
    await observe(port, seen, "worker.take_on_wakeup", _wakeup(port, "m3", run_id), "w3", 30, SERVED)  # and taken
    await observe(port, seen, "worker.adopt", "w1", 30, SERVED, 10)  # it waits no more


async def a_write_carries_its_ledger_row_and_refuses_a_known_key(port: Port, seen: list[Any]) -> None:
    stored = await new_run(port, seen)
    run_id = stored.snapshot.run_id
    fence = await _taken(port, seen, stored, "w1")
    stored = await observe(port, seen, "worker.load", run_id)
    request = _request(port, run_id, fence)
    planned = plan(stored, [ev.RunStatusChanged(seq=2, at=1001.0, to=RunStatus.RUNNING, reason="taken")])
    after = await observe(port, seen, "worker.commit", Transition(planned, fence, call=request))
    await observe(port, seen, "ledger.get", request.idempotency_key)
    await observe(port, seen, "worker.commit", Transition(planned, fence))  # the same revision again: stale
    await observe(port, seen, "worker.commit", Transition(planned, Fence("w9", 9)))  # not the lease holder
    charged = plan(after, [ev.BudgetCharged(seq=3, at=1002.0, tool_calls=1)])
    # A first call whose key is on the ledger already: refused for another request (nothing written) ...
    await observe(port, seen, "worker.commit", Transition(charged, fence, call=_request(port, run_id, fence,
                                                                                        hash_="b" * 64)))
    await observe(port, seen, "worker.load", run_id)
    # ... and one more attempt of the same one, written with the transition.
    await observe(port, seen, "worker.commit", Transition(charged, fence, call=request))
    await observe(port, seen, "ledger.get", request.idempotency_key)
    await observe(port, seen, "worker.resend", run_id, fence, 30, request, ())
    await observe(port, seen, "worker.resend", run_id, Fence("w9", 9), 30, request, ())  # LeaseLost, nothing recorded
    await observe(port, seen, "ledger.get", request.idempotency_key)


async def a_call_s_timers_ride_with_its_submission_move_with_its_heartbeats_and_end_with_its_outcome(
        port: Port, seen: list[Any]) -> None:
    stored = await new_run(port, seen)
    run_id = stored.snapshot.run_id
    fence = await _taken(port, seen, stored, "w1")
    stored = await observe(port, seen, "worker.load", run_id)
    request = replace(_request(port, run_id, fence), effect_kind=EffectKind.IDEMPOTENT_WRITE.value)
    watched = calls.call_timers(run_id, "step:0", token=fence.token, start_to_close=TTL, heartbeat_timeout=TTL)
    planned = plan(stored, [
        ev.RunStatusChanged(seq=2, at=1001.0, to=RunStatus.RUNNING, reason="taken"),
        ev.ActionPrepared(seq=3, at=1001.0, logical_action="step:0", tool="bench.echo", tool_version="1",
                          effect_kind=EffectKind.IDEMPOTENT_WRITE, idempotency_key=request.idempotency_key,
                          request_hash=request.request_hash),
        ev.ActionSubmitted(seq=4, at=1001.0, logical_action="step:0")])
    after = await observe(port, seen, "worker.commit", Transition(planned, fence, Rides(timers=watched), call=request))
    # A heartbeat lands for its own attempt only, and moves its heartbeat timer past the start-to-close
    for token in (fence.token, fence.token + 1):
        await observe(port, seen, "worker.beat", request.idempotency_key, token, {"done": token},
                      timer_key=watched[1]["timer_key"], due_in=TTL * 10)
    await observe(port, seen, "ledger.get", request.idempotency_key)
    await port.sleep(TTL * 5)  # past start-to-close and its grace
    await observe(port, seen, "timers.claim_due", limit=10)
    # The outcome cancels both: nothing is due, not even once the heartbeat's would have been
    answered = plan(after, [ev.ActionConfirmed(seq=5, at=1002.0, logical_action="step:0")])
    await observe(port, seen, "worker.commit", Transition(answered, fence))
    await port.sleep(TTL * 10)
    await observe(port, seen, "timers.claim_due", limit=10)


async def an_outcome_and_a_wait_commit_with_their_transition(port: Port, seen: list[Any]) -> None:
    stored = await new_run(port, seen)
    run_id = stored.snapshot.run_id
    fence = await _taken(port, seen, stored, "w1")
    stored = await observe(port, seen, "worker.load", run_id)
    request = _request(port, run_id, fence)
    now = 1001.0  # the deciding clock: a wait's deadline is scheduled relative to it
    planned = plan(stored, [ev.RunStatusChanged(seq=2, at=now, to=RunStatus.RUNNING, reason="taken")])
    after = await observe(port, seen, "worker.commit", Transition(planned, fence, call=request))
    confirmed = plan(after, [ev.BudgetCharged(seq=3, at=now, tool_calls=1)])
    after = await observe(port, seen, "worker.commit", Transition(confirmed, fence, outcome=LedgerOutcome(
        request.idempotency_key, ActionStatus.CONFIRMED, {"external_id": "x-1", "receipt": {"step": 0}})))
    await observe(port, seen, "ledger.get", request.idempotency_key)
    # A wait that parks the run releases the lease and schedules its deadline, a broadcast riding along.
    wait = Wait(wait_id="w1", kind="ci", deadline=now + TTL, correlation_key=f"ci/{port.prefix}")
    parked = plan(after, [ev.WaitStarted(seq=4, at=now, status=RunStatus.WAITING_EVENT, wait=wait)],
                       release_lease=True)
    rides = effects.broadcast_rides(after.snapshot, parked.after, producer="contract", cause="contract")
    await observe(port, seen, "worker.commit", Transition(parked, fence, rides))
    await observe(port, seen, "worker.load", run_id)
    await port.sleep(TTL * 2.5)
    await observe(port, seen, "timers.claim_due", limit=10)


# -- the operator's and the gateway's use cases over a RunTransaction ---------------------------------


def _at(seconds: float) -> Any:
    return lambda: seconds


async def _parked(port: Port, seen: list[Any], wait: Wait, status: RunStatus) -> StoredRun:
    stored = await new_run(port, seen)
    return await observe(port, seen, "runs.append", stored, [
        ev.RunStatusChanged(seq=2, at=1001.0, to=RunStatus.RUNNING, reason="taken"),
        ev.WaitStarted(seq=3, at=1001.0, status=status, wait=wait)], release_lease=True)


def _approver(subject: str) -> Principal:
    return Principal(subject, frozenset({"approver"}), None)


async def operators_decide_only_what_is_asked_by_whom_it_names(port: Port, seen: list[Any]) -> None:
    wait = Wait(wait_id="w1", kind="approval", deadline=9000.0, approval_id="merge", owner="alice",
                approved_hash="a" * 64)
    stored = await _parked(port, seen, wait, RunStatus.WAITING_USER)
    run_id = stored.snapshot.run_id
    decide = {"approval_id": "merge", "approved": True, "reason": "ok", "clock": _at(1002.0)}
    await observe(port, seen, "operate.decide_approval", run_id, approved_hash="a" * 64, by=_approver("bob"),
                  **decide)
    await observe(port, seen, "operate.decide_approval", run_id, approved_hash="b" * 64, by=_approver("alice"),
                  **decide)
    await observe(port, seen, "operate.decide_approval", run_id, approved_hash="a" * 64, by=_approver("alice"),
                  **decide)
    await observe(port, seen, "operate.pause", run_id, actor="ops", reason="hold", clock=_at(1003.0))
    await observe(port, seen, "operate.resume", run_id, actor="ops", reason="go", clock=_at(1004.0))
    await observe(port, seen, "operate.cancel", run_id, actor="ops", reason="stop", clock=_at(1005.0))
    await observe(port, seen, "operate.terminate", run_id, actor="ops", reason="now", clock=_at(1006.0))
    await observe(port, seen, "operate.cancel", run_id, actor="ops", reason="again", clock=_at(1007.0))
    await observe(port, seen, "operate.cancel", f"{port.prefix}-ghost", actor="ops", reason="none")
    await observe(port, seen, "runs.history", run_id)


async def webhooks_match_a_waiting_run_now_or_when_it_waits(port: Port, seen: list[Any]) -> None:
    def ci_finished(event_id: str, status: str) -> dict[str, Any]:
        return {"type": "ci.finished", "id": f"{port.prefix}-{event_id}", "repo": port.prefix, "ci_run_id": 7,
                "status": status, "sha": "abc123"}

    early, late = ci_finished("e1", "passed"), ci_finished("e2", "failed")
    clock = {"clock": _at(1002.0), "providers": {"forge": forge}}
    # Before any run waits for it: kept. The same event again: the first outcome, nothing new.
    await observe(port, seen, "webhooks.receive", "forge", early, **clock)
    await observe(port, seen, "webhooks.receive", "forge", early, **clock)
    wait = Wait(wait_id="w1", kind="ci", deadline=9000.0, correlation_key=f"ci/{port.prefix}/7")
    waiting = await _parked(port, seen, wait, RunStatus.WAITING_EVENT)
    # The wait starts: the kept event ends it at once.
    await observe(port, seen, "webhooks.match_kept", waiting, **clock)
    await observe(port, seen, "runs.load", waiting.snapshot.run_id)
    # A later event for a key no run waits on any more is kept, unmatched.
    await observe(port, seen, "webhooks.receive", "forge", late, **clock)
    await observe(port, seen, "runs.history", waiting.snapshot.run_id)


async def creates_are_admitted_at_once_while_their_tenant_has_room(port: Port, seen: list[Any]) -> None:
    ids = iter(range(1, 100))
    registry = Registry([RunKind("steps", VERSIONS, Steps(), {})])

    async def create(key: str, input_: dict[str, Any], workflow: str = "steps") -> None:
        request = make("run.create", {"workflow": workflow, "idempotency_key": key, "input": input_},
                       producer="contract", tenant_id=port.prefix)
        await observe(port, seen, "admit.create_run", request, kinds=registry, partitions=1, slots=1,
                      max_input_bytes=1000, clock=_at(1000.0), new_id=lambda: f"{port.prefix}-r{next(ids)}")

    await create("k1", {"steps": 1})  # admitted: the tenant's one slot
    await create("k1", {"steps": 1})  # the same request: the same run, announced again
    await create("k1", {"steps": 2})  # the key with another input: refused
    await create("k2", {"steps": 1})  # no slot left: queued
    await create("k3", {"steps": 1}, workflow="nothing")  # unknown: refused
    await create("k4", {"blob": "x" * 2000})  # too large: refused
    for name in ("r1", "r2"):
        await observe(port, seen, "runs.load", f"{port.prefix}-{name}")


async def a_finishing_run_hands_its_slot_to_its_tenants_best_queued_run(port: Port, seen: list[Any]) -> None:
    ids = iter(range(1, 100))
    registry = Registry([RunKind("steps", VERSIONS, Steps(), {})])
    for key in ("k1", "k2", "k3"):  # one slot: the first admitted at once, the others queued in turn
        request = make("run.create", {"workflow": "steps", "idempotency_key": key, "input": {"steps": 1}},
                       producer="contract", tenant_id=port.prefix)
        await observe(port, seen, "admit.create_run", request, kinds=registry, partitions=1, slots=1,
                      max_input_bytes=1000, clock=_at(1000.0), new_id=lambda: f"{port.prefix}-r{next(ids)}")
    first = f"{port.prefix}-r1"
    fence = await _taken(port, seen, await port.call("worker.load", first), "w1")
    stored = await observe(port, seen, "worker.load", first)
    handover = Handover(port.prefix, slots=1, aging_seconds=1e9, exchange="runs", routes={0: "p.0"},
                        channel="admission",
                        wake={"tenant_id": port.prefix, "reason": "admitted", "cause": f"slot:{first}",
                              "producer": "contract", "trace": None})
    # When the admitted run fails, carrying the handover
    failed = plan(stored, [ev.RunStatusChanged(seq=stored.seq(1), at=1001.0, to=RunStatus.RUNNING, reason="taken"),
                           ev.RunStatusChanged(seq=stored.seq(2), at=1001.0, to=RunStatus.FAILED, reason="gave up")],
                  release_lease=True)
    await observe(port, seen, "worker.commit", Transition(failed, fence, Rides(handover=handover)))
    # Then the oldest queued run took its slot and was woken, and the other stays queued
    for name in ("r1", "r2", "r3"):
        await observe(port, seen, "runs.load", f"{port.prefix}-{name}")
    await observe(port, seen, "outbox.sent")
    # and the end of a run that held no slot hands nothing on
    last = f"{port.prefix}-r3"  # a queued run is taken on no wakeup: its lease is taken as such
    fence = await observe(port, seen, "leases.take_lease", last, "w2", 30)
    queued = await observe(port, seen, "worker.load", last)
    ended = plan(queued, [ev.RunTerminated(seq=queued.seq(1), at=1002.0, by="ops", reason="not needed")],
                 release_lease=True)
    await observe(port, seen, "worker.commit", Transition(ended, fence, Rides(handover=handover)))
    for name in ("r2", "r3"):
        await observe(port, seen, "runs.load", f"{port.prefix}-{name}")
    await observe(port, seen, "outbox.sent")


async def a_tenants_own_slots_hold_at_creation_and_at_handover(port: Port, seen: list[Any]) -> None:
    ids = iter(range(1, 100))
    registry = Registry([RunKind("steps", VERSIONS, Steps(), {})])
    # Given a tenant with 2 slots of its own where the platform gives 1
    await port.call("limits.own_slots", port.prefix, 2)
    for key in ("k1", "k2", "k3", "k4"):  # the first two admitted at once, the others queued
        request = make("run.create", {"workflow": "steps", "idempotency_key": key, "input": {"steps": 1}},
                       producer="contract", tenant_id=port.prefix)
        await observe(port, seen, "admit.create_run", request, kinds=registry, partitions=1, slots=1,
                      max_input_bytes=1000, clock=_at(1000.0), new_id=lambda: f"{port.prefix}-r{next(ids)}")
    first = f"{port.prefix}-r1"
    fence = await _taken(port, seen, await port.call("worker.load", first), "w1")
    stored = await observe(port, seen, "worker.load", first)
    handover = Handover(port.prefix, slots=1, aging_seconds=1e9, exchange="runs", routes={0: "p.0"},
                        channel="admission",
                        wake={"tenant_id": port.prefix, "reason": "admitted", "cause": f"slot:{first}",
                              "producer": "contract", "trace": None})
    # When an admitted run fails, carrying the platform's 1 slot in its handover
    failed = plan(stored, [ev.RunStatusChanged(seq=stored.seq(1), at=1001.0, to=RunStatus.RUNNING, reason="taken"),
                           ev.RunStatusChanged(seq=stored.seq(2), at=1001.0, to=RunStatus.FAILED, reason="gave up")],
                  release_lease=True)
    await observe(port, seen, "worker.commit", Transition(failed, fence, Rides(handover=handover)))
    # Then the tenant's own 2 slots hold: the oldest queued run took the slot, the last stays queued
    for name in ("r1", "r2", "r3", "r4"):
        await observe(port, seen, "runs.load", f"{port.prefix}-{name}")
    await observe(port, seen, "outbox.sent")


# -- the reconciler's sweeps over a ReconcileStore -------------------------------------------------------

LOOKED_UP, PURE_STEP, BLIND = "probe.open_pr", "probe.echo", "probe.post"
EFFECTS = {LOOKED_UP: EffectKind.NON_IDEMPOTENT_WRITE, PURE_STEP: EffectKind.PURE,
           BLIND: EffectKind.NON_IDEMPOTENT_WRITE}
REQUEST = {"repo": "acme/payments", "title": "Upgrade payment-sdk"}
FOUND = ToolResult("42", {"id": 42, **REQUEST})


def _far_side(answers: Mapping[str, list[Any]]) -> Registry:
    """``steps`` whose ``LOOKED_UP`` looks keys up in ``answers`` (in turn, the last again and again; an
    exception is raised), ``PURE_STEP`` and ``BLIND`` without lookup; all keep ``ECHO``'s (never run)."""
    async def lookup(key: str) -> ToolResult | None:
        queue = answers.get(key, [None])
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    tools = {name: replace(ECHO, name=name, effect=effect, lookup=lookup if name == LOOKED_UP else None)
             for name, effect in EFFECTS.items()}
    return Registry([RunKind("steps", VERSIONS, Steps(), tools)])


async def _submitted(port: Port, seen: list[Any], name: str, tool: str, *, unknown: bool) -> tuple[str, str]:
    """A run whose worker submitted ``pr`` with ``tool``; ``unknown``: and then got no answer (the run
    parked in ACTION_UNKNOWN, the ledger row UNKNOWN), else the row stays SUBMITTED. (run id, key)."""
    stored = await new_run(port, seen, name)
    run_id, key, digest, effect = stored.snapshot.run_id, f"{port.prefix}-{name}-pr", "d" * 64, EFFECTS[tool]
    events: list[ev.RunEvent] = [
        ev.RunStatusChanged(seq=2, at=1001.0, to=RunStatus.RUNNING, reason="taken"),
        ev.ActionPrepared(seq=3, at=1001.0, logical_action="pr", tool=tool, tool_version="1", effect_kind=effect,
                          idempotency_key=key, request_hash=digest),
        ev.ActionSubmitted(seq=4, at=1001.0, logical_action="pr")]
    if unknown:
        events += [ev.ActionUnknown(seq=5, at=1002.0, logical_action="pr", cause="no answer"),
                   ev.RunStatusChanged(seq=6, at=1002.0, to=RunStatus.ACTION_UNKNOWN, reason="pr: unknown")]
    await observe(port, seen, "runs.append", stored, events, release_lease=True)
    await observe(port, seen, "ledger.prepare", action_id=f"{port.prefix}-{name}-a", run_id=run_id,
                  logical_action="pr", tool=tool, tool_version="1", effect_kind=effect.value, idempotency_key=key,
                  request_hash=digest, request=dict(REQUEST), fencing_token=1)
    if unknown:
        await observe(port, seen, "ledger.record", key, ActionStatus.UNKNOWN)
    return run_id, key


async def a_parked_run_gives_its_slot_back_and_is_queued_again_when_woken(port: Port, seen: list[Any]) -> None:
    ids = iter(range(1, 100))
    registry = Registry([RunKind("steps", VERSIONS, Steps(), {})])
    for key in ("k1", "k2"):  # one slot: the first admitted at once, the second queued
        request = make("run.create", {"workflow": "steps", "idempotency_key": key, "input": {"steps": 1}},
                       producer="contract", tenant_id=port.prefix)
        await observe(port, seen, "admit.create_run", request, kinds=registry, partitions=1, slots=1,
                      max_input_bytes=1000, clock=_at(1000.0), new_id=lambda: f"{port.prefix}-r{next(ids)}")
    first = f"{port.prefix}-r1"
    fence = await _taken(port, seen, await port.call("worker.load", first), "w1")
    stored = await observe(port, seen, "worker.load", first)
    handover = Handover(port.prefix, slots=1, aging_seconds=1e9, exchange="runs", routes={0: "p.0"},
                        channel="admission",
                        wake={"tenant_id": port.prefix, "reason": "admitted", "cause": f"slot:{first}",
                              "producer": "contract", "trace": None})
    # When the admitted run parks on its far side's health, carrying the handover
    wait = health_wait(wait_id="h1", far_side="forge", logical_action="step:0", now=1001.0, max_wait=600)
    parked = plan(stored, [ev.RunStatusChanged(seq=stored.seq(1), at=1001.0, to=RunStatus.RUNNING, reason="taken"),
                           ev.WaitStarted(seq=stored.seq(2), at=1001.0, status=RunStatus.RETRY_SCHEDULED, wait=wait)],
                  release_lease=True)
    await observe(port, seen, "worker.commit", Transition(parked, fence, Rides(handover=handover)))
    # Then it holds no slot, and the queued run took it and was woken
    for name in ("r1", "r2"):
        await observe(port, seen, "runs.load", f"{port.prefix}-{name}")
    await observe(port, seen, "outbox.sent")
    # and woken, it is queued: no wakeup puts it on a worker
    stored = await observe(port, seen, "runs.load", first)
    await observe(port, seen, "runs.append", stored, [ev.RunWoken(
        seq=stored.seq(1), at=1002.0, wait_id="h1", reason=WakeReason.EVENT, correlation_key=wait.correlation_key)])
    await observe(port, seen, "runs.load", first)
    await observe(port, seen, "worker.take_on_wakeup", _wakeup(port, "again", first), "w1", 30, SERVED)


async def actions_in_doubt_are_settled_by_what_the_far_side_answers(port: Port, seen: list[Any]) -> None:
    # Found, contradicted, nothing, no lookup (pure; not to repeat), no answer yet; still out: ended run, live run.
    cases = {"found": (LOOKED_UP, [FOUND]), "nothing": (LOOKED_UP, [None]), "pure": (PURE_STEP, []),
             "clash": (LOOKED_UP, [ToolResult("43", {**REQUEST, "repo": "other"})]), "blind": (BLIND, []),
             "flaky": (LOOKED_UP, [ToolUnavailable(LOOKED_UP, "down"), FOUND]), "ended": (LOOKED_UP, [FOUND]),
             "live": (LOOKED_UP, [FOUND])}
    kinds = _far_side({f"{port.prefix}-{name}-pr": answer for name, (_, answer) in cases.items()})
    settled = [await _submitted(port, seen, name, tool, unknown=name not in ("ended", "live"))
               for name, (tool, _) in cases.items()]
    await observe(port, seen, "operate.terminate", settled[-2][0], actor="ops", reason="incident", clock=_at(1003.0))
    # Once abandoned, the deferred claim and the terminated run's request are taken; a live run's never is.
    # (Abandoned after more than the eight runs' setup may take on a loaded machine: PostgreSQL's clock
    # runs on while they are written, the memory world's does not.)
    abandoned_after = TTL * 5
    for pause in (0.0, abandoned_after * 1.25):
        await port.sleep(pause)
        await observe(port, seen, "settle.in_doubt", limit=50, abandoned_after=abandoned_after)
        for _ in range(2):  # the second sweep finds nothing left
            await observe(port, seen, "settle.settle_in_doubt", kinds, limit=50, clock=_at(2000.0),
                          abandoned_after=abandoned_after)
    for run_id, key in settled:
        for name, arg in (("runs.load", run_id), ("runs.history", run_id), ("ledger.get", key)):
            await observe(port, seen, name, arg)
    await observe(port, seen, "outbox.sent")


async def expired_leases_are_cleared_and_runs_with_work_woken(port: Port, seen: list[Any]) -> None:
    wait = Wait(wait_id="w1", kind="ci", deadline=9000.0, correlation_key=f"ci/{port.prefix}")
    after_taking: dict[str, list[ev.RunEvent]] = {
        "running": [], "alive": [],
        "failed": [ev.RunStatusChanged(seq=3, at=1002.0, to=RunStatus.FAILED, reason="gave up")],
        "waiting": [ev.WaitStarted(seq=3, at=1002.0, status=RunStatus.WAITING_EVENT, wait=wait)]}
    run_ids = []
    for name, events in after_taking.items():
        stored = await new_run(port, seen, name)
        run_ids.append(stored.snapshot.run_id)
        fence = await observe(port, seen, "leases.take_lease", run_ids[-1], name, 30 if name == "alive" else TTL)
        await observe(port, seen, "runs.append", stored, [
            ev.RunStatusChanged(seq=2, at=1001.0, to=RunStatus.RUNNING, reason="taken"), *events], fence=fence)
    await observe(port, seen, "lease_sweep.rewake_expired", limit=10)
    await port.sleep(TTL * 2.5)
    # Every expired lease is cleared; only the run a worker has work for is woken, once.
    for _ in range(2):
        await observe(port, seen, "lease_sweep.rewake_expired", limit=10)
    for run_id in run_ids:
        await observe(port, seen, "runs.load", run_id)
    await observe(port, seen, "outbox.sent")


async def operators_migrate_a_run_only_to_a_version_that_takes_it_over(port: Port, seen: list[Any]) -> None:
    def version(workflow: str, **migrates_from: Any) -> RunKind:
        return RunKind("steps", replace(VERSIONS, workflow=workflow), Steps(), {},
                       migrates_from={k.removeprefix("v"): v for k, v in migrates_from.items()})

    kinds = Registry([version("1"), version("2", v1={"*"}), version("3", v1={"review"})])
    wait = Wait(wait_id="w1", kind="approval", deadline=9000.0, approval_id="merge", owner="alice",
                approved_hash="a" * 64)
    run_id = (await _parked(port, seen, wait, RunStatus.WAITING_USER)).snapshot.run_id
    move = {"actor": "ops", "reason": "release 2", "kinds": kinds, "clock": _at(1002.0)}
    await observe(port, seen, "operate.migrate", run_id, to_version="9", **move)  # not deployed
    await observe(port, seen, "operate.migrate", run_id, to_version="3", **move)  # not at its stage
    await observe(port, seen, "operate.migrate", run_id, to_version="2", **move)
    await observe(port, seen, "runs.find", port.prefix, "key-r1")  # the version columns follow
    await observe(port, seen, "operate.terminate", run_id, actor="ops", reason="done", clock=_at(1003.0))
    await observe(port, seen, "operate.migrate", run_id, to_version="2", **move)  # finished: refused
    await observe(port, seen, "runs.history", run_id)


async def a_patch_is_written_once_with_the_decision_it_changed(port: Port, seen: list[Any]) -> None:
    # ``tests.ci_gate`` on the real worker: its retry after a failed CI run takes the patch; that worker
    # dies right after writing it (its second commit), and a successor finishes the run.
    created = ev.RunCreated(seq=1, at=1000.0, run_id=f"{port.prefix}-ci", tenant_id=port.prefix, kind=ci_gate.KIND,
                            goal=freeze(ci_gate.GOAL), versions=ci_gate.VERSIONS,
                            budget=Usage(model_calls=1, tool_calls=5, cost=1.0))
    run_id = (await observe(port, seen, "runs.create", created, idempotency_key="key-ci", input_hash="h" * 64,
                            partition=3)).snapshot.run_id
    await observe(port, seen, "runs.admit", run_id)
    for owner, crash in (("w1", CrashAt("worker.after_commit", 2)), ("w2", CrashAt())):
        # The receipts are small: nothing is uploaded to the artifact store.
        worker = Worker(store=port.worker, kinds=Registry([ci_gate.kind()]), model=ScriptedModel({}),
                        artifacts=MemoryArtifacts(), instance_id=owner, lease_ttl=TTL, clock=port.now,
                        crash_points=crash)
        wakeup = make("run.wakeup", {"wakeup_id": owner, "reason": "test"}, producer="tests", tenant_id=port.prefix,
                      run_id=run_id)
        taken = (await worker.on_wakeup(wakeup)).outcome
        with contextlib.suppress(Crashed):
            await worker.run_steps(run_id, Fence(taken["owner"], taken["token"]), wakeup.event_id)
        seen.append((owner, crash.reached, [e.type for e in await port.call("runs.history", run_id)]))
        await port.sleep(TTL * 2.5)  # the dead worker's lease expires
    history = await port.call("runs.history", run_id)
    seen.append(("history", [(e.type, getattr(e, "logical_action", None), getattr(e, "patch", None),
                              getattr(e, "workflow_version", None)) for e in history]))
    markers = [i for i, e in enumerate(history) if isinstance(e, ev.PatchTaken)]
    assert len(markers) == 1 and history[markers[0] + 1].type == "action.prepared"
    run = (await port.call("runs.load", run_id)).snapshot
    seen.append(("run", run.status.value, run.patches))
    await observe(port, seen, "outbox.sent")


def _cleanup_row(attempts: int, alerted: bool, done_at: Any, last_error: str | None) -> dict[str, Any]:
    return {"attempts": attempts, "alerted": alerted, "done": done_at is not None, "last_error": last_error}


def _tidy(effects: Counter[str]) -> Registry:
    """``steps`` at ``VERSIONS`` releasing a workspace at closure (the far side refuses each key's first
    attempt, then counts the effect in ``effects``), and at version 2 with no cleanup step."""
    attempts: Counter[str] = Counter()

    async def release(args: Mapping[str, Any], key: str, token: int) -> ToolResult:
        attempts[key] += 1
        if attempts[key] == 1:
            raise ToolUnavailable("sandbox.release", "busy")
        effects[key] += 1
        return ToolResult(f"released:{args['step']}", {"released": args["step"]})

    releasing = replace(ECHO, name="sandbox.release", effect=EffectKind.IDEMPOTENT_WRITE, execute=release)
    tools = {ECHO.name: ECHO, releasing.name: releasing}
    return Registry([
        RunKind("steps", VERSIONS, Steps(), tools, cleanup=(CleanupStep("release", releasing.name, lambda r: {"step": 7}),),
                cleanup_retry=RetryPolicy(initial_interval=0.2, jitter=0.0)),
        RunKind("steps", replace(VERSIONS, workflow="2"), Steps(), tools)])


async def a_finished_run_s_cleanup_is_retried_then_done_and_a_terminated_one_owes_none(
        port: Port, seen: list[Any]) -> None:
    effects: Counter[str] = Counter()
    kinds = _tidy(effects)
    # A run that fails owes its cleanup; one of a kind with no cleanup step too, until the sweep drops it;
    # a terminated one owes none
    failed, terminated = await new_run(port, seen, "failed"), await new_run(port, seen, "terminated")
    plain = await observe(port, seen, "runs.create",
                          replace(created(port, "plain", at=1000.0), versions=replace(VERSIONS, workflow="2")),
                          idempotency_key="key-plain", input_hash="h" * 64, partition=3)
    for stored in (failed, plain):
        await observe(port, seen, "runs.append", stored, [
            ev.RunStatusChanged(seq=2, at=1001.0, to=RunStatus.RUNNING, reason="taken"),
            ev.RunStatusChanged(seq=3, at=1002.0, to=RunStatus.FAILED, reason="gave up")], release_lease=True)
    await observe(port, seen, "operate.terminate", terminated.snapshot.run_id, actor="ops", reason="incident",
                  clock=_at(1003.0))
    run_ids = [failed.snapshot.run_id, plain.snapshot.run_id, terminated.snapshot.run_id]
    for run_id in run_ids:
        await observe(port, seen, "cleanups.row", run_id)
    # The first attempt fails (alerted), the next after its backoff succeeds (resolved), once
    for pause in (0.0, 0.3, 0.3):
        await port.sleep(pause)
        await observe(port, seen, "cleanup_sweep.clean_up", kinds, limit=10, clock=_at(2000.0), rng=random.Random(0))
        for run_id in run_ids:
            await observe(port, seen, "cleanups.row", run_id)
    await observe(port, seen, "runs.load", failed.snapshot.run_id)
    await observe(port, seen, "runs.history", failed.snapshot.run_id)
    await observe(port, seen, "audit.alerts", failed.snapshot.run_id)
    rows = await port.call("ledger.for_run", failed.snapshot.run_id)
    seen.append([(r.logical_action, r.status, r.attempts, r.external_id, r.effect_kind) for r in rows])
    seen.append(sorted(effects.values()))


SCENARIOS: list[Scenario] = [
    creation_is_idempotent_per_tenant_and_key,
    appends_are_guarded_by_revision_and_stored_seq,
    late_events_are_stored_not_applied,
    leases_fence_stale_workers,
    one_ledger_row_per_idempotency_key,
    inbox_answers_a_repeat_with_the_recorded_outcome,
    timers_fire_once_when_due,
    a_wakeup_takes_the_lease_once,
    a_queued_run_is_taken_on_no_wakeup_until_admitted,
    a_run_not_served_waits_for_a_worker_that_runs_it,
    a_write_carries_its_ledger_row_and_refuses_a_known_key,
    a_call_s_timers_ride_with_its_submission_move_with_its_heartbeats_and_end_with_its_outcome,
    an_outcome_and_a_wait_commit_with_their_transition,
    operators_decide_only_what_is_asked_by_whom_it_names,
    operators_migrate_a_run_only_to_a_version_that_takes_it_over,
    webhooks_match_a_waiting_run_now_or_when_it_waits,
    creates_are_admitted_at_once_while_their_tenant_has_room,
    a_finishing_run_hands_its_slot_to_its_tenants_best_queued_run,
    a_tenants_own_slots_hold_at_creation_and_at_handover,
    a_parked_run_gives_its_slot_back_and_is_queued_again_when_woken,
    actions_in_doubt_are_settled_by_what_the_far_side_answers,
    expired_leases_are_cleared_and_runs_with_work_woken,
    a_patch_is_written_once_with_the_decision_it_changed,
    a_finished_run_s_cleanup_is_retried_then_done_and_a_terminated_one_owes_none,
]


def _normalised(port: Port, seen: list[Any]) -> Any:
    return json.loads(json.dumps(seen, sort_keys=True, default=str).replace(port.prefix, "<p>"))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_memory_store_answers_like_the_real_store(clean, engine: AsyncEngine, statements: Pool, tmp_path: Any,
                                                       scenario: Scenario) -> None:
    real, memory = Real(engine, statements, FilesystemArtifactStore(tmp_path)), Memory()
    seen_real: list[Any] = []
    seen_memory: list[Any] = []
    await scenario(real, seen_real)
    await scenario(memory, seen_memory)
    expected, got = _normalised(real, seen_real), _normalised(memory, seen_memory)
    for i, (want, have) in enumerate(zip(expected, got, strict=False)):
        assert have == want, f"call {i} ({want[0]}): the real store answered\n  {want}\nthe memory store\n  {have}"
    assert len(got) == len(expected)
    memory.world.close()
