"""The scheduler's ingress consumer on PostgreSQL: a batch of run.creates and run.signals in one
transaction, each create made by ``app.scheduler.admit.create_run`` (or refused) and each signal
recorded by ``app.scheduler.signal_intake`` (or refused) through a ``PgTransaction``."""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.app import effects
from longrun.app.scheduler import signal_intake
from longrun.app.scheduler.admit import PRODUCER, Locked, create_run, readable_outer, refuse_publisher
from longrun.authoring import Registry
from longrun.bus.consumer import PUBLISHER
from longrun.db import outbox, policies
from longrun.db.transaction import PgTransaction
from longrun.domain import TenantPolicy
from longrun.envelope import Envelope
from longrun.envelope.payloads import RejectionCode
from longrun.errors import DecodeError, PoisonMessage, UnknownSchemaVersion
from longrun.services.scheduler.producers import ProducerTenants


class Ingress:
    """The scheduler's ingress consumer: its ``prelude`` and its ``handle`` share one transaction per
    batch of messages, and what the prelude read."""

    def __init__(self, *, kinds: Registry, partitions: int, slots: int, max_input_bytes: int,
                 producers: ProducerTenants) -> None:
        self.kinds = kinds
        self.options = {"kinds": kinds, "partitions": partitions, "slots": slots, "max_input_bytes": max_input_bytes}
        self.producers = producers
        self._read: WeakKeyDictionary[AsyncConnection, dict[str, TenantPolicy | None]] = WeakKeyDictionary()

    async def prelude(self, conn: AsyncConnection, envelopes: list[Envelope]) -> None:
        """Before any create, the batch takes its tenants' admission locks in tenant order, so two
        batches cannot deadlock, each with the tenant's policy in the same statement."""
        self._read[conn] = {tenant: await policies.lock_and_load(conn, tenant)
                            for tenant in sorted({e.tenant_id for e in envelopes if e.type == "run.create"})}

    async def handle(self, conn: AsyncConnection, envelope: Envelope) -> dict[str, Any]:
        """``create_run`` in the consumer's transaction, under the lock and policy the prelude read,
        when the create's publisher may create runs in its tenant; a signal, when it may act there."""
        publisher = PUBLISHER.get()
        if envelope.type == "run.signal":
            return await signal_intake.receive(PgTransaction(conn), envelope, publisher=publisher,
                                               allowed=self.producers.allows(publisher, envelope.tenant_id),
                                               kinds=self.kinds, partitions=self.options["partitions"])
        if envelope.type != "run.create":
            # The ingress binds run.create's and run.signal's routing keys, but a producer chooses the type in the body.
            raise DecodeError(f"a {envelope.type} on the ingress, where only run.create and run.signal are read", b"")
        if not self.producers.allows(publisher, envelope.tenant_id):
            refused = await refuse_publisher(PgTransaction(conn), envelope, publisher,
                                             partitions=self.options["partitions"])
            return refused.outcome
        created = await create_run(PgTransaction(conn), envelope, **self.options,
                                   locked=Locked(self._read[conn][envelope.tenant_id]))
        return created.outcome


async def refuse(conn: AsyncConnection, body: bytes, error: PoisonMessage, *, partitions: int) -> None:
    """The ingress's answer to a run.create it cannot read: ``run.rejected`` to its producer when
    its envelope names a tenant (and so a routing key) and an id; nothing otherwise."""
    outer = readable_outer(body)
    if outer is None:
        return
    code = (RejectionCode.UNKNOWN_SCHEMA_VERSION if isinstance(error, UnknownSchemaVersion)
            else RejectionCode.INVALID_PAYLOAD)
    await outbox.enqueue_many(conn, [effects.rejected_message(
        tenant_id=outer.tenant_id, correlation_id=outer.correlation_id, refused_event_id=outer.event_id,
        idempotency_key=outer.idempotency_key, code=code, reason=str(error), partitions=partitions,
        producer=PRODUCER)])
