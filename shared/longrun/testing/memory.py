"""The store in memory: ``db/runs.py`` + ``db/actions.py`` + ``db/inbox.py`` + ``db/timers.py`` over
dicts of frozen rows, with the same answers (``tests/integration/test_memory_contract.py`` runs the
same calls against PostgreSQL and this).

One guarded write per transition (expected revision AND stored seq, plus lease owner and fencing
token for a worker: ``LeaseLost`` when the fence no longer matches, else ``StaleRevision``, and
nothing written); late events stored with ``applied=False``; leases that expire by a ``FakeClock``
(the database clock), a fencing token that grows on every takeover; an inbox claim that answers a
repeat with the recorded outcome; one ledger row per idempotency key, refusing another request hash.
``transaction()`` gives the all-or-nothing of a database transaction. It reuses the pure ``ports.runs.plan``.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from longrun.authoring import pins_key
from longrun.db.actions import LedgerRow, first_row
from longrun.db.inbox import Claimed, Duplicate
from longrun.db.runs import DEADLINE_TIMER_SUFFIX, QUEUE_TIMER_SUFFIX
from longrun.db.timers import DueBatch, RunHead
from longrun.domain.lease import Lease, can_take
from longrun.domain.slots import queued
from longrun.ports.timers import DueTimer
from longrun.domain import TERMINAL, WORKER_HAS_WORK, ActionStatus, RunSnapshot, children, closure, evolve, freeze
from longrun.domain import queue_stint_starts
from longrun.domain import events as ev
from longrun.domain.concurrency import KeyClaim
from longrun.domain.calls import CALL_TIMERS
from longrun.errors import IdempotencyKeyReused, LeaseLost, StaleRevision
from longrun.ports.runs import Fence, Found, Planned, StoredRun, plan
from longrun.testing.children import ChildLink, tell_parent

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
    awaiting_worker: str | None = None
    key: KeyClaim | None = None
    key_held: bool = False
    """Taken at the run's first admission (``runs.concurrency_held_at``)."""
    parent: ChildLink | None = None


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
    progress: Mapping[str, Any] | None = None
    heartbeat_at: float | None = None
    created: int = 0
    """Insertion order (``created_at`` in the database)."""
    updated: float = 0.0
    """``updated_at``: the clock at the last write."""

    def ledger_row(self) -> LedgerRow:
        return LedgerRow(self.action_id, self.run_id, self.logical_action, self.tool, self.effect_kind,
                         self.idempotency_key, self.request_hash, dict(self.request), self.status, self.attempts,
                         self.external_id, None if self.receipt is None else dict(self.receipt),
                         None if self.progress is None else dict(self.progress), _ts(self.heartbeat_at))


_OUTCOME_COLUMNS = ("external_id", "receipt", "receipt_ref", "last_error")
_LEDGER_COLUMNS = frozenset({"attempts", "fencing_token", *_OUTCOME_COLUMNS})


@dataclass(frozen=True, slots=True)
class TimerRow:
    timer_key: str
    run_id: str
    kind: str
    wake_at: float
    payload: Mapping[str, Any]
    fired_at: float | None = None
    cancelled_at: float | None = None

    @property
    def open(self) -> bool:
        return self.fired_at is None and self.cancelled_at is None


@dataclass(frozen=True, slots=True)
class CleanupRow:
    """``cleanups``: a finished run's cleanup, due at ``due_at`` (the world's clock)."""

    due_at: float
    attempts: int = 0
    last_error: str | None = None
    alerted: bool = False
    done_at: float | None = None


@dataclass(frozen=True, slots=True)
class Write:
    """One successful worker write, with the lease as the store saw it (for the fencing invariant)."""

    run_id: str
    fence: Fence
    owner_at_write: str | None
    token_at_write: int


def _ts(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


def _lease(row: RunRow) -> Lease | None:
    """The run's lease as the domain's rule reads it (None: nobody holds it)."""
    if row.lease_owner is None or row.lease_until is None:
        return None
    return Lease(row.lease_owner, row.lease_until, row.fencing_token)


def _ends(cancel: closure.Cancel, timer: TimerRow) -> bool:
    """Whether ``cancel`` covers the open ``timer`` (``runs.write``'s closure)."""
    return ((cancel.everything and timer.kind != children.ENDED_TIMER) or (cancel.wait_id is not None and timer.payload.get("wait_id") == cancel.wait_id)
            or (timer.kind in CALL_TIMERS and timer.payload.get("logical_action") in cancel.calls))


class MemoryStore:
    """``db/runs.py`` + ``db/actions.py`` + ``db/inbox.py`` + ``db/timers.py`` over dicts of frozen rows."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.runs: dict[str, RunRow] = {}
        self.events: dict[str, tuple[EventRow, ...]] = {}
        self.actions: dict[str, ActionRow] = {}
        self.inbox: dict[tuple[str, str], dict[str, Any]] = {}
        self.timers: dict[str, TimerRow] = {}
        self.cleanups: dict[str, CleanupRow] = {}
        self.writes: tuple[Write, ...] = ()
        self._order = itertools.count(1)

    # -- transactions ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[MemoryStore]:
        """All or nothing: any exception restores every table as it was."""
        saved = (dict(self.runs), dict(self.events), dict(self.actions), dict(self.inbox), dict(self.timers),
                 self.writes, dict(self.cleanups))
        try:
            yield self
        except BaseException:
            self.runs, self.events, self.actions, self.inbox, self.timers, self.writes, self.cleanups = saved
            raise

    def tables(self) -> tuple[object, ...]:
        """Everything stored, for "nothing changed" assertions."""
        return (dict(self.runs), dict(self.events), dict(self.actions), dict(self.inbox), dict(self.timers),
                dict(self.cleanups))

    # -- runs (db/runs.py) -------------------------------------------------------------------------
    def _stored(self, row: RunRow) -> StoredRun:
        return StoredRun(row.snapshot, row.stored_seq, row.partition, row.lease_owner, _ts(row.lease_until),
                         row.fencing_token, row.admitted)

    def create(self, created: ev.RunCreated, *, idempotency_key: str, input_hash: str,
               partition: int, key: KeyClaim | None = None) -> StoredRun | None:
        snapshot = evolve(None, created)
        if any(r.tenant_id == created.tenant_id and r.idempotency_key == idempotency_key for r in self.runs.values()):
            return None
        if created.run_id in self.runs:
            raise UniqueViolation(f"run {created.run_id} exists")
        self.runs[created.run_id] = RunRow(snapshot, created.seq, partition, None, None, 0, False,
                                           created.tenant_id, idempotency_key, input_hash, key=key)
        self.events[created.run_id] = (EventRow(created, True, None),)
        if created.deadline is not None:
            self.schedule(timer_key=created.run_id + DEADLINE_TIMER_SUFFIX, run_id=created.run_id,
                          kind="business_deadline", delay=created.deadline - created.at, payload={})
        if queue_stint_starts(None, snapshot):
            self._queue(snapshot)
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
        row = self.runs[run_id]
        self.runs[run_id] = replace(row, admitted=True, key_held=row.key is not None)

    def key_holders(self, tenant_id: str, key: str, *, besides: str | None = None) -> int:
        """As ``db.admission.key_holders``: the tenant's unfinished runs holding ``key``, but ``besides``."""
        return sum(1 for r in self.runs.values() if r.tenant_id == tenant_id and r.key_held and r.key is not None
                   and r.key.key == key and r.snapshot.status not in TERMINAL and r.snapshot.run_id != besides)

    def append(self, stored: StoredRun, events: Sequence[ev.RunEvent], *, fence: Fence | None = None,
               release_lease: bool = False) -> StoredRun:
        return self.write(plan(stored, events, release_lease=release_lease), fence=fence)

    def write(self, planned: Planned, *, fence: Fence | None = None) -> StoredRun:
        """``runs.write``'s guard: the expected revision and stored seq, and for a worker its fence
        (``LeaseLost`` when that no longer holds, else ``StaleRevision``); nothing written on refusal."""
        stored = planned.before
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
            admitted=row.admitted and not planned.gives_slot_back,
            lease_owner=None if planned.release_lease else row.lease_owner,
            lease_until=None if planned.release_lease else row.lease_until)
        self.events[run_id] = self.events[run_id] + tuple(
            EventRow(event, applied, fence.token if fence else None) for event, applied in planned.rows)
        if fence is not None:
            self.writes = (*self.writes, Write(run_id, fence, row.lease_owner, row.fencing_token))
        cancel = planned.cancel
        if cancel is not None:
            for key, timer in self.timers.items():
                if timer.run_id == run_id and timer.open and _ends(cancel, timer):
                    self.timers[key] = replace(timer, cancelled_at=self.clock())
        if planned.queue_stint:
            self._queue(after.snapshot)
        if planned.owes_cleanup:
            self.cleanups.setdefault(run_id, CleanupRow(due_at=self.clock()))
        tell_parent(self.schedule, planned, row.parent)

    def _queue(self, after: RunSnapshot) -> None:
        """``db.runs``: the schedule-to-start timer of the queue stint a write starts."""
        assert after.timeouts.schedule_to_start is not None
        self.schedule(timer_key=f"{after.run_id}{QUEUE_TIMER_SUFFIX}{after.revision}", run_id=after.run_id,
                      kind="schedule_to_start", delay=after.timeouts.schedule_to_start,
                      payload={"revision": after.revision})

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
        if row is None or not self._lease_free(row):
            return None
        token = row.fencing_token + 1
        self.runs[run_id] = replace(row, lease_owner=owner, lease_until=self.clock() + ttl, fencing_token=token,
                                    awaiting_worker=None)
        if row.snapshot.timeouts.schedule_to_start is not None:  # ``db.runs``: the take ends the queue stint
            for key, timer in self.timers.items():
                if timer.run_id == run_id and timer.kind == "schedule_to_start" and timer.open:
                    self.timers[key] = replace(timer, cancelled_at=self.clock())
        return Fence(owner, token)

    def _lease_free(self, row: RunRow) -> bool:
        return can_take(_lease(row), self.clock())

    @staticmethod
    def is_queued(row: RunRow) -> bool:
        """``db.leases``: a queued run is never taken on a wakeup or adopted (``domain.slots.queued``)."""
        return queued(row.snapshot.status, row.admitted)

    @staticmethod
    def served(row: RunRow, served: Collection[str]) -> bool:
        return pins_key(row.snapshot.kind, row.snapshot.versions) in served

    def decline(self, run_id: str) -> str | None:
        """``db.leases.take_on_wakeup`` for a run the worker does not serve: marked as waiting for a
        worker that does, if one has work for it; what it waits for."""
        row = self.runs.get(run_id)
        if row is None or not self._lease_free(row) or row.snapshot.status not in WORKER_HAS_WORK \
                or self.is_queued(row):
            return None
        needs = f"{row.snapshot.kind}@{row.snapshot.versions.workflow}"
        self.runs[run_id] = replace(row, awaiting_worker=needs)
        return needs

    def adopt(self, owner: str, ttl: float, served: Collection[str], limit: int) -> list[str]:
        """``db.leases.adopt``: the runs taken."""
        waiting = [run_id for run_id, row in self.runs.items()
                   if row.awaiting_worker is not None and self.served(row, served) and self._lease_free(row)
                   and not self.is_queued(row)]
        return [run_id for run_id in waiting[:limit] if self.take_lease(run_id, owner, ttl) is not None]

    def hand_over(self, run_id: str, fence: Fence) -> None:
        """``db.leases.hand_over``."""
        row = self.runs.get(run_id)
        if row is not None and row.lease_owner == fence.owner and row.fencing_token == fence.token:
            self.runs[run_id] = replace(row, lease_owner=None, lease_until=None,
                                        awaiting_worker=f"{row.snapshot.kind}@{row.snapshot.versions.workflow}")

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
                if r.lease_owner is not None and r.lease_until is not None and can_take(_lease(r), now)]
        return [run_id for _, run_id in sorted(held)]

    def clear_lease(self, run_id: str) -> None:
        """The reconciler's clearing of an expired lease (no token change: the next take bumps it)."""
        self.runs[run_id] = replace(self.runs[run_id], lease_owner=None, lease_until=None)

    # -- the ledger (db/actions.py) -------------------------------------------------------------------
    def prepare(self, **request: Any) -> None:
        """``ledger.prepare``: a request's first attempt (``ledger.first_row``'s arguments), or one more
        attempt of the same request under a known key, refused if its request hash differs."""
        row = first_row(**request)
        key = row["idempotency_key"]
        existing = self.actions.get(key)
        if existing is None:
            self.insert_first(row)
            return
        if existing.request_hash != row["request_hash"]:
            raise IdempotencyKeyReused(key, existing.request_hash, row["request_hash"])
        outcome = {k: row[k] for k in _OUTCOME_COLUMNS if k in row}
        self.record(key, ActionStatus(row["status"]), attempts=existing.attempts + 1,
                    fencing_token=row["fencing_token"], **outcome)

    def insert_first(self, row: Mapping[str, Any]) -> None:
        """A ledger row as ``ledger.first_row`` builds it; ``UniqueViolation`` if its key or its
        (run, logical action) is on the ledger already."""
        key, run_id, logical_action = row["idempotency_key"], row["run_id"], row["logical_action"]
        if key in self.actions or any(a.run_id == run_id and a.logical_action == logical_action
                                      for a in self.actions.values()):
            raise UniqueViolation(f"run {run_id} already has a ledger row for {logical_action} or key {key}")
        self.actions[key] = ActionRow(
            row["action_id"], run_id, logical_action, row["tool"], row["tool_version"], row["effect_kind"], key,
            row["request_hash"], freeze(dict(row["request"])), row["status"], row["attempts"],  # type: ignore[arg-type]
            row["fencing_token"], **{k: row[k] for k in _OUTCOME_COLUMNS if k in row},
            created=next(self._order), updated=self.clock())

    def record(self, idempotency_key: str, status: ActionStatus, **fields: Any) -> None:
        unknown = set(fields) - _LEDGER_COLUMNS
        if unknown:
            raise TypeError(f"no ledger column(s) {sorted(unknown)}")
        row = self.actions.get(idempotency_key)
        if row is not None:
            self.actions[idempotency_key] = replace(row, status=status.value, updated=self.clock(), **fields)

    def beat(self, idempotency_key: str, *, fencing_token: int, progress: Mapping[str, Any] | None,
             timer_key: str | None, due_in: float) -> bool:
        """``ledger.beat``: the heartbeat of the attempt under ``fencing_token``, its timer moved."""
        row = self.actions.get(idempotency_key)
        if row is None or row.fencing_token != fencing_token or row.status != ActionStatus.SUBMITTED.value:
            return False
        self.actions[idempotency_key] = replace(row, progress=progress, heartbeat_at=self.clock())
        timer = self.timers.get(timer_key) if timer_key is not None else None
        if timer is not None and timer.open:
            self.timers[timer.timer_key] = replace(timer, wake_at=self.clock() + due_in)
        return True

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

    def cancel_calls(self, run_id: str, logical_action: str) -> None:
        """``timers.cancel_calls``."""
        for key, timer in self.timers.items():
            if (timer.run_id == run_id and timer.open and timer.kind in CALL_TIMERS
                    and timer.payload.get("logical_action") == logical_action):
                self.timers[key] = replace(timer, cancelled_at=self.clock())

    def claim_due(self, *, limit: int) -> DueBatch | None:
        now = self.clock()
        rows = sorted((t for t in self.timers.values() if t.open and t.wake_at <= now),
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
                       dict(run.labels), run.kind, run.timeouts.schedule_to_start is not None, admitted=row.admitted)

    def mark_fired(self, timer_keys: Sequence[str]) -> None:
        for key in timer_keys:
            if key in self.timers:
                self.timers[key] = replace(self.timers[key], fired_at=self.clock(), cancelled_at=None)

    def next_wake_at(self) -> float | None:
        pending = [t.wake_at for t in self.timers.values() if t.open]
        return min(pending) if pending else None

