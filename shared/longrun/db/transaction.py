"""The scheduler's, the operator's and the gateway's transaction (``ports.stores.RunTransaction``) on
PostgreSQL: one connection inside a transaction (``engine.begin()``, or a consumer's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun import otel
from longrun.db import actions as ledger
from longrun.db import admission
from longrun.db import audit as audit_log
from longrun.db import children as child_rows
from longrun.db import inbox, keys, outbox, policies, runs
from longrun.db.schema import runs as runs_table
from longrun.db.schema import webhook_deliveries, webhook_events
from longrun.domain import MATCHED_BY_KEY, PinnedVersions, TenantPolicy
from longrun.domain import events as ev
from longrun.domain.concurrency import KeyClaim, KeyedRun
from longrun.ports.runs import LedgerOutcome, StoredRun
from longrun.ports.webhooks import Translated

_MATCHED_BY = sorted(s.value for s in MATCHED_BY_KEY)


class PgTransaction:
    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn

    async def load(self, run_id: str, *, lock: bool = False) -> StoredRun | None:
        return await runs.load(self.conn, run_id, lock=lock)

    async def append(self, stored: StoredRun, events: Sequence[ev.RunEvent]) -> StoredRun:
        return await runs.append(self.conn, stored, events)

    async def send(self, messages: Sequence[outbox.Message]) -> None:
        await outbox.enqueue_many(self.conn, messages)

    async def notify(self, channel: str, key: str) -> None:
        await admission.notify(self.conn, channel, [key])

    async def audit(self, *, actor: str, action: str, target: str, reason: str, details: Mapping[str, Any]) -> None:
        await audit_log.audit(self.conn, actor=actor, action=action, target=target, reason=reason,
                             details=dict(details), tenant=audit_log.tenant_of_run(target))

    async def record(self, outcome: LedgerOutcome) -> None:
        await ledger.record(self.conn, outcome.key, outcome.status, **outcome.fields)

    async def claim(self, service: str, message_id: str, message_type: str) -> inbox.Claimed | inbox.Duplicate:
        return await inbox.claim(self.conn, service, message_id=message_id, message_type=message_type, run_id=None)

    async def record_outcome(self, service: str, message_id: str, outcome: Mapping[str, Any]) -> None:
        await inbox.record_outcome(self.conn, service, message_id=message_id, outcome=dict(outcome))

    async def keep(self, provider: str, event: Translated, payload: Mapping[str, Any], *, remember: bool) -> bool:
        if remember and (await self.conn.execute(
                insert(webhook_deliveries).values(provider=provider, event_id=event.event_id)
                .on_conflict_do_nothing().returning(webhook_deliveries.c.event_id))).first() is None:
            return False
        return (await self.conn.execute(insert(webhook_events).values(
            provider=provider, event_id=event.event_id, correlation_key=event.correlation_key,
            payload=dict(payload), fact_key=event.fact_key, fact=dict(event.fact))
            .on_conflict_do_nothing().returning(webhook_events.c.event_id))).first() is not None

    async def waiting_on(self, provider: str, correlation_key: str) -> str | None:
        return (await self.conn.execute(
            text("SELECT run_id FROM runs WHERE wait_correlation_key = :k AND status = ANY(:statuses) "
                 "AND snapshot #>> '{wait,provider}' = :p LIMIT 1"),
            {"k": correlation_key, "statuses": _MATCHED_BY, "p": provider})).scalar()

    async def kept_for(self, provider: str, correlation_key: str) -> Translated | None:
        row = (await self.conn.execute(
            select(webhook_events.c.event_id, webhook_events.c.fact_key, webhook_events.c.fact)
            .where(webhook_events.c.correlation_key == correlation_key, webhook_events.c.provider == provider,
                   webhook_events.c.matched_run_id.is_(None))
            .order_by(webhook_events.c.received_at).limit(1).with_for_update(skip_locked=True))).first()
        if row is None:
            return None
        return Translated(row.event_id, correlation_key, row.fact_key, row.fact)

    async def matched(self, provider: str, event_id: str, run_id: str) -> None:
        await self.conn.execute(update(webhook_events)
                                .where(webhook_events.c.provider == provider, webhook_events.c.event_id == event_id)
                                .values(matched_run_id=run_id, matched_at=text("now()")))

    async def signal_seen(self, run_id: str, signal_id: str) -> bool:
        return (await self.conn.execute(
            text("SELECT EXISTS (SELECT 1 FROM run_events WHERE run_id = :r AND type = :t "
                 "AND data ->> 'signal_id' = :s)"),
            {"r": run_id, "t": ev.SignalReceived.type, "s": signal_id})).scalar_one()

    async def repin(self, run_id: str, versions: PinnedVersions) -> None:
        await self.conn.execute(update(runs_table).where(runs_table.c.run_id == run_id).values(
            workflow_version=versions.workflow, prompt_version=versions.prompt,
            model_policy_version=versions.model_policy, tool_schema_version=versions.tool_schemas))

    async def lock_tenant(self, tenant_id: str) -> TenantPolicy | None:
        return await policies.lock_and_load(self.conn, tenant_id)

    async def find(self, tenant_id: str, idempotency_key: str) -> runs.Found | None:
        return await runs.find(self.conn, tenant_id, idempotency_key)

    async def create(self, created: ev.RunCreated, *, idempotency_key: str, input_hash: str, partition: int,
                     at_once: runs.AtOnce, announce: Sequence[outbox.Message],
                     key: KeyClaim | None = None) -> StoredRun | None:
        # The span creating the run (the scheduler's, for its run.create) is the run's root.
        return await runs.create(self.conn, created, idempotency_key=idempotency_key, input_hash=input_hash,
                                 partition=partition, at_once=at_once, announce=announce,
                                 trace_root=otel.current(), key=key)

    async def keyed_runs(self, tenant_id: str, claim: KeyClaim, *, up_to: int) -> list[KeyedRun]:
        return await keys.open_runs(self.conn, tenant_id, claim, up_to=up_to)

    async def link_child(self, child_run_id: str, *, parent_run_id: str, name: str, on_parent_cancel: str) -> None:
        await child_rows.link(self.conn, child_run_id=child_run_id, parent_run_id=parent_run_id, name=name,
                              on_parent_cancel=on_parent_cancel)

    async def children_to_cancel(self, parent_run_id: str) -> list[str]:
        return await child_rows.open_to_cancel(self.conn, parent_run_id)
