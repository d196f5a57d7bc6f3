"""The scheduler's, the operator's and the gateway's transaction (``ports.stores.RunTransaction``) in
memory: the ``World``'s tables, inside ``World.in_transaction`` (all or nothing)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from longrun.app.effects import ADMISSION_CHANNEL
from longrun.db import outbox
from longrun.db.inbox import Claimed, Duplicate
from longrun.db.schema import QUEUED_STATUS
from longrun.domain import MATCHED_BY_KEY, TERMINAL, PinnedVersions, TenantPolicy
from longrun.domain import events as ev
from longrun.domain.concurrency import KeyClaim, KeyedRun
from longrun.ports.runs import AtOnce, Found, LedgerOutcome, StoredRun
from longrun.ports.webhooks import Translated
from longrun.testing.children import ChildLink
from longrun.testing.tables import Tables



class MemoryTransaction:
    def __init__(self, world: Tables) -> None:
        self.world = world
        self.store = world.store

    async def load(self, run_id: str, *, lock: bool = False) -> StoredRun | None:
        return self.store.load(run_id)

    async def append(self, stored: StoredRun, events: Sequence[ev.RunEvent]) -> StoredRun:
        return self.store.append(stored, events)

    async def send(self, messages: Sequence[outbox.Message]) -> None:
        self.world.send(messages)

    async def notify(self, channel: str, key: str) -> None:
        """Admission's is the one channel listened on: its round for the tenant ``key`` runs now."""
        if channel == ADMISSION_CHANNEL:
            self.world.admit(key)

    async def audit(self, *, actor: str, action: str, target: str, reason: str, details: Mapping[str, Any]) -> None:
        self.world.audit_log.append({"actor": actor, "action": action, "target": target, "reason": reason,
                                     "details": dict(details)})

    async def record(self, outcome: LedgerOutcome) -> None:
        self.store.record(outcome.key, outcome.status, **outcome.fields)

    async def claim(self, service: str, message_id: str, message_type: str) -> Claimed | Duplicate:
        return self.store.claim(service, message_id=message_id, message_type=message_type, run_id=None)

    async def record_outcome(self, service: str, message_id: str, outcome: Mapping[str, Any]) -> None:
        self.store.record_outcome(service, message_id=message_id, outcome=dict(outcome))

    async def keep(self, provider: str, event: Translated, payload: Mapping[str, Any], *, remember: bool) -> bool:
        if (provider, event.event_id) in self.world.kept:
            return False
        self.world.kept[(provider, event.event_id)] = (event, None)
        return True

    async def waiting_on(self, provider: str, correlation_key: str) -> str | None:
        for run_id, row in self.store.runs.items():
            wait = row.snapshot.wait
            if row.snapshot.status in MATCHED_BY_KEY and wait is not None and \
                    (wait.provider, wait.correlation_key) == (provider, correlation_key):
                return run_id
        return None

    async def kept_for(self, provider: str, correlation_key: str) -> Translated | None:
        for (kept_by, _), (event, matched) in self.world.kept.items():
            if matched is None and (kept_by, event.correlation_key) == (provider, correlation_key):
                return event
        return None

    async def matched(self, provider: str, event_id: str, run_id: str) -> None:
        event, _ = self.world.kept[(provider, event_id)]
        self.world.kept[(provider, event_id)] = (event, run_id)

    async def signal_seen(self, run_id: str, signal_id: str) -> bool:
        return any(isinstance(e, ev.SignalReceived) and e.signal_id == signal_id for e in self.store.history(run_id))

    async def repin(self, run_id: str, versions: PinnedVersions) -> None:
        """Nothing to do: the memory store reads a run's pins from its snapshot."""

    async def lock_tenant(self, tenant_id: str) -> TenantPolicy | None:
        """Nothing to wait for (the memory world runs one transaction at a time); the tenant's policy."""
        return self.world.policies.get(tenant_id)

    async def find(self, tenant_id: str, idempotency_key: str) -> Found | None:
        return self.store.find(tenant_id, idempotency_key)

    async def create(self, created: ev.RunCreated, *, idempotency_key: str, input_hash: str, partition: int,
                     at_once: AtOnce, announce: Sequence[outbox.Message],
                     key: KeyClaim | None = None) -> StoredRun | None:
        # Counted before the run exists, as one statement.
        room = self._has_room(created.tenant_id, at_once.slots) and (
            key is None or self.store.key_holders(created.tenant_id, key.key) < key.limit)
        stored = self.store.create(created, idempotency_key=idempotency_key, input_hash=input_hash,
                                   partition=partition, key=key)
        if stored is None:
            return None
        self.world.send(announce)
        if not room:
            return stored
        self.store.admit(created.run_id)
        self.world.send([at_once.wakeup])
        return replace(stored, admitted=True)

    async def keyed_runs(self, tenant_id: str, claim: KeyClaim, *, up_to: int) -> list[KeyedRun]:
        """As ``db.keys.open_runs``."""
        rows = [r for r in self.store.runs.values() if r.tenant_id == tenant_id and r.key is not None
                and r.key.key == claim.key and r.snapshot.status not in TERMINAL]
        rows.sort(key=lambda r: (r.snapshot.created_at, r.snapshot.run_id))
        return [KeyedRun(r.snapshot.run_id, r.key_held, r.snapshot.cancel_requested) for r in rows[:up_to]]

    async def link_child(self, child_run_id: str, *, parent_run_id: str, name: str, on_parent_cancel: str) -> None:
        row = self.store.runs[child_run_id]
        if row.parent is None:
            self.store.runs[child_run_id] = replace(row, parent=ChildLink(parent_run_id, name, on_parent_cancel))

    async def children_to_cancel(self, parent_run_id: str) -> list[str]:
        """As ``db.children.open_to_cancel``."""
        return sorted(run_id for run_id, r in self.store.runs.items() if r.parent is not None
                      and r.parent.parent_run_id == parent_run_id and r.parent.on_parent_cancel == "cancel"
                      and r.snapshot.status not in TERMINAL)

    def _has_room(self, tenant_id: str, slots: int) -> bool:
        """As ``db.admission.tenant_slots``: fewer admitted open runs than the tenant's slots (its own, else
        ``slots``), and none queued."""
        slots = self.world.tenant_slots.get(tenant_id, slots)
        rows = [r for r in self.store.runs.values() if r.tenant_id == tenant_id]
        active = sum(1 for r in rows if r.admitted and r.snapshot.status not in TERMINAL)
        queued = any(not r.admitted and r.snapshot.status is QUEUED_STATUS for r in rows)
        return active < slots and not queued
