"""A producer's ``run.signal`` on the ingress: ``app.signals.send`` bound to the publisher's tenants.

The security of creates holds for signals: a signal is taken only when its publishing broker user
may act in the tenant the message names (``services.scheduler.producers``), and then only for a run
of that tenant, so a producer can never reach another tenant's run (answered ``run_not_found``,
as for a run that does not exist). Every refusal is answered with ``run.rejected`` on the named
tenant's key (``refused_event_id``: the signal's event_id) and audited with its publisher; nothing
is recorded on any run and nothing goes to quarantine (a replay would publish it as the runtime).
"""

from __future__ import annotations

from typing import Any

from longrun.app import effects, signals
from longrun.app.gateway.operate import RunNotFound
from longrun.authoring import Registry
from longrun.envelope import Envelope
from longrun.envelope.payloads import SignalRejectionCode as RejectionCode
from longrun.ports.stores import RunTransaction

PRODUCER = "scheduler"


async def receive(tx: RunTransaction, envelope: Envelope, *, publisher: str | None, allowed: bool, kinds: Registry,
                  partitions: int) -> dict[str, Any]:
    """The signal recorded on its run (``signals.send``'s answer), or refused and answered; the
    outcome the ingress's inbox keeps. ``allowed``: the publisher may act in the message's tenant."""
    signal = envelope.payload
    if not allowed:
        why = (f"the publisher may not signal runs in tenant {envelope.tenant_id!r}" if publisher is not None
               else "the run.signal names no publisher: set its AMQP user_id to the connection's user")
        return await _refuse(tx, envelope, publisher, RejectionCode.TENANT_NOT_ALLOWED, why, partitions)
    if envelope.run_id is None:
        return await _refuse(tx, envelope, publisher, RejectionCode.RUN_NOT_FOUND,
                             "the run.signal names no run: set the envelope's run_id", partitions)
    try:
        return await signals.send(tx, envelope.run_id, signal_id=signal.signal_id, name=signal.name,
                                  payload=signal.payload, sent_by=f"producer:{publisher}",
                                  actor=f"broker-user:{publisher}", kinds=kinds,
                                  reason=f"run.signal {envelope.event_id}", tenant_id=envelope.tenant_id,
                                  producer=PRODUCER)
    except RunNotFound:
        return await _refuse(tx, envelope, publisher, RejectionCode.RUN_NOT_FOUND,
                             f"no run {envelope.run_id!r} in tenant {envelope.tenant_id!r}", partitions)
    except signals.SignalRefused as e:
        return await _refuse(tx, envelope, publisher, RejectionCode.SIGNAL_REFUSED, str(e), partitions,
                             problems=e.problems)


async def _refuse(tx: RunTransaction, envelope: Envelope, publisher: str | None, code: RejectionCode, reason: str,
                  partitions: int, **details: Any) -> dict[str, Any]:
    signal = envelope.payload
    await tx.audit(actor=f"broker-user:{publisher or '-'}", action="run.signal.refused", target=envelope.tenant_id,
                   reason=reason, details={"publisher": publisher, "event_id": envelope.event_id, "code": code.value,
                                           "run_id": envelope.run_id, "signal_id": signal.signal_id,
                                           "name": signal.name, **details})
    await tx.send([effects.rejected_message(
        tenant_id=envelope.tenant_id, correlation_id=envelope.correlation_id or signal.signal_id,
        refused_event_id=envelope.event_id, idempotency_key=None, code=code, reason=reason, partitions=partitions,
        producer=PRODUCER)])
    return {"rejected": True, "code": code.value, "reason": reason, "run_id": envelope.run_id,
            "signal_id": signal.signal_id}
