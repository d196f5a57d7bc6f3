"""The in-memory store keeps the real store's contract: same calls, same answers, same refusals.

``longrun.testing.memory.MemoryStore`` stands in for PostgreSQL in the property tests. Each
scenario here is one sequence of store calls (``db/runs.py``, ``db/actions.py``, ``db/inbox.py``,
``db/timers.py``), run once against the real store (each call its own transaction) and once
against the memory store; what every call returned or raised is recorded, normalised (ids,
clocks) and must be identical. A divergence means the model the property tests trust has
drifted from the runtime.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, is_dataclass
from typing import Any, Protocol

import pytest
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.db import actions as ledger
from longrun.db import inbox, runs, timers
from longrun.db.runs import Fence, StoredRun
from longrun.domain import (
    ActionStatus,
    EffectKind,
    PinnedVersions,
    RunStatus,
    Usage,
    Wait,
    WakeReason,
    event_to_dict,
    freeze,
)
from longrun.domain import events as ev
from longrun.testing.memory import FakeClock, MemoryStore

pytestmark = pytest.mark.integration

VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="contract-v1")
TTL = 0.4
"""Lease seconds: short, because the real store's clock is PostgreSQL's and the test sleeps for real."""


class Port(Protocol):
    prefix: str

    def now(self) -> float: ...
    async def sleep(self, seconds: float) -> None: ...
    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any: ...


class Real:
    """``longrun.db`` over PostgreSQL: every call in its own transaction."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.prefix = f"pg{uuid.uuid4().hex[:6]}"

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        module, function = name.split(".")
        target = {"runs": runs, "ledger": ledger, "inbox": inbox, "timers": timers}[module]
        async with self.engine.begin() as conn:
            return await getattr(target, function)(conn, *args, **kwargs)


class Memory:
    def __init__(self) -> None:
        self.clock = FakeClock(time.time())
        self.store = MemoryStore(self.clock)
        self.prefix = f"mem{uuid.uuid4().hex[:6]}"

    def now(self) -> float:
        return self.clock()

    async def sleep(self, seconds: float) -> None:
        self.clock.advance(seconds)

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        module, function = name.split(".")
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
    if isinstance(value, StoredRun):
        return {"snapshot": value.snapshot.to_dict(), "stored_seq": value.stored_seq, "partition": value.partition,
                "lease_owner": value.lease_owner, "leased": value.lease_until is not None,
                "fencing_token": value.fencing_token, "admitted": value.admitted}
    if isinstance(value, ev.RunEvent):
        return event_to_dict(value)
    if isinstance(value, timers.DueBatch):  # its ``now`` is each store's own clock
        return {"timers": _plain(value.timers), "heads": {k: _plain(v) for k, v in value.heads.items()}}
    if isinstance(value, timers.DueTimer):
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


async def new_run(port: Port, seen: list[Any], name: str = "r1") -> StoredRun:
    stored = await observe(port, seen, "runs.create", created(port, name, at=1000.0),
                           idempotency_key=f"key-{name}", input_hash="h" * 64, partition=3)
    assert stored is not None
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
    old = await observe(port, seen, "runs.take_lease", run_id, "w-old", TTL)
    await observe(port, seen, "runs.take_lease", run_id, "w-new", TTL)  # live: refused
    await observe(port, seen, "runs.extend_lease", run_id, old, TTL)
    await port.sleep(TTL * 2.5)
    new = await observe(port, seen, "runs.take_lease", run_id, "w-new", 30)
    current = await observe(port, seen, "runs.load", run_id)
    take = [ev.RunStatusChanged(seq=2, at=1001.0, to=RunStatus.RUNNING, reason="taken")]
    await observe(port, seen, "runs.append", current, take, fence=old)  # stale: LeaseLost
    await observe(port, seen, "runs.extend_lease", run_id, old, TTL)
    await observe(port, seen, "runs.release_lease", run_id, old)  # a no-op for a stale fence
    await observe(port, seen, "runs.load", run_id)
    await observe(port, seen, "runs.append", current, take, fence=new)
    await observe(port, seen, "runs.append", current, take, fence=new)  # the same revision twice: stale
    await observe(port, seen, "runs.release_lease", run_id, new)
    after = await observe(port, seen, "runs.load", run_id)
    yielded = [ev.RunStatusChanged(seq=3, at=1002.0, to=RunStatus.READY, reason="yield")]
    await observe(port, seen, "runs.append", after, yielded, fence=new)  # released: the fence is gone
    await observe(port, seen, "runs.take_lease", run_id, "w-third", 30)  # the token grows on every takeover
    await observe(port, seen, "runs.append", after, yielded, fence=Fence("w-third", 3), release_lease=True)
    await observe(port, seen, "runs.load", run_id)
    await observe(port, seen, "runs.take_lease", f"{port.prefix}-ghost", "w", 30)


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


SCENARIOS: list[Scenario] = [
    creation_is_idempotent_per_tenant_and_key,
    appends_are_guarded_by_revision_and_stored_seq,
    late_events_are_stored_not_applied,
    leases_fence_stale_workers,
    one_ledger_row_per_idempotency_key,
    inbox_answers_a_repeat_with_the_recorded_outcome,
    timers_fire_once_when_due,
]


def _normalised(port: Port, seen: list[Any]) -> Any:
    return json.loads(json.dumps(seen, sort_keys=True, default=str).replace(port.prefix, "<p>"))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_memory_store_answers_like_the_real_store(clean, engine: AsyncEngine, scenario: Scenario) -> None:
    real, memory = Real(engine), Memory()
    seen_real: list[Any] = []
    seen_memory: list[Any] = []
    await scenario(real, seen_real)
    await scenario(memory, seen_memory)
    expected, got = _normalised(real, seen_real), _normalised(memory, seen_memory)
    for i, (want, have) in enumerate(zip(expected, got, strict=False)):
        assert have == want, f"call {i} ({want[0]}): the real store answered\n  {want}\nthe memory store\n  {have}"
    assert len(got) == len(expected)
