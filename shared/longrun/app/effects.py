"""The messages that ride along with a run transition: wakeups, broadcasts, answers to creates.

Kept in one place so every writer (worker, scheduler, timer, gateway, reconciler, operator)
wakes runs and broadcasts status changes the same way. Pure: the writers send what it makes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from longrun.bus import topology, wakeup
from longrun.domain import (
    RECEIPT_FACT_PREFIX,
    TERMINAL,
    PinnedVersions,
    RunSnapshot,
    thaw,
    closure,
    to_plain,
)
from longrun.domain import slots
from longrun.domain import events as ev
from longrun.envelope import ENVELOPES, LATEST, DataClass, Envelope, make
from longrun.envelope.model import new_event_id, utcnow
from longrun.envelope.registry import traceparent
from longrun.envelope.payloads import RejectionCode, SignalRejectionCode
from longrun.ports.runs import Handover, Message, Rides, StoredRun, TenantCharge

ADMISSION_CHANNEL = "longrun_admission"


def wake_message(stored: StoredRun, *, reason: str, producer: str, cause: str) -> Message:
    """Ask a worker to advance the run (the message names the run, the state is in PostgreSQL);
    ``cause``: what made the run ready (a message's event_id, or who acted)."""
    run = stored.snapshot
    return wake_message_of(tenant_id=run.tenant_id, run_id=run.run_id, revision=run.revision,
                           partition=stored.partition, reason=reason, producer=producer, cause=cause)


def wake_unless_queued(stored: StoredRun, *, reason: str, producer: str, cause: str) -> Message | None:
    """``wake_message`` for a run a wait's end made ready; None when that leaves it queued
    (``domain.slots.queued``: its wait held no slot). A worker would refuse such a run: admission
    admits it by priority and wakes it then, so its writer tells admission (``ADMISSION_CHANNEL``)."""
    if slots.queued(stored.snapshot.status, stored.admitted):
        return None
    return wake_message(stored, reason=reason, producer=producer, cause=cause)


def wake_message_of(*, tenant_id: str, run_id: str, revision: int, partition: int, reason: str,
                    producer: str, cause: str) -> Message:
    """``wake_message`` from the run's columns, for a writer that did not read its snapshot."""
    kept = wakeup.wake(tenant_id=tenant_id, run_id=run_id, revision=revision, reason=reason, cause=cause,
                       producer=producer, trace=traceparent())
    return Message(wakeup.envelope(kept), *wakeup_route(partition), partition)


def wakeup_route(partition: int) -> tuple[str, str]:
    """Where a wakeup of a run in ``partition`` is published: its exchange and routing key."""
    return topology.work_exchange("worker"), topology.partition_key(partition)


PublicReceipts = Mapping[str, tuple[str, ...]]
"""Tool name -> the receipt fields its declaration makes public (``Registry.public_receipts``)."""
EXTERNAL_IDS_ONLY: PublicReceipts = MappingProxyType({})
"""For a writer that does not know the run's kind: its outcome shows external ids alone."""


def broadcast_message(before: RunSnapshot, after: StoredRun, *, producer: str, cause: str,
                      public: PublicReceipts = EXTERNAL_IDS_ONLY) -> Message | None:
    """Status changes go to the events topic for downstream consumers, under the run's tenant, with
    the producer's correlation id and the run's labels; a terminal one carries the run's outcome.
    Facts stay private. ``cause``: the id of what caused the change (a message's event_id)."""
    run = after.snapshot
    if run.status is before.status:
        return None
    envelope = status_envelope(tenant_id=run.tenant_id, run_id=run.run_id, seq=run.last_seq, status=run.status.value,
                               was=before.status.value, stage=run.stage, reason=run.terminal_reason or "",
                               labels=thaw(run.labels),
                               outcome=run_outcome(run, public) if run.status in TERMINAL else None,
                               correlation_id=run.correlation_id, producer=producer, cause=cause, trace=traceparent())
    return Message(_parsed(envelope), *status_route(run.tenant_id, run.status.value), after.partition)


RUN_EVENT = "run.event"


def status_envelope(*, tenant_id: str, run_id: str, seq: int, status: str, was: str, stage: str, reason: str,
                    labels: Mapping[str, str], outcome: dict[str, Any] | None, correlation_id: str | None,
                    producer: str, cause: str, trace: str | None, occurred_at: str | None = None) -> dict[str, Any]:
    """A run's status change as its ``run.event`` (``run_event_envelope``): what ``broadcast_message`` sends,
    and what a writer of many (the timer's bulk wake) writes as it is."""
    return run_event_envelope(tenant_id=tenant_id, run_id=run_id, seq=seq, event_type="run.status_changed",
                              status=status, data={"from": was, "stage": stage, "reason": reason}, labels=labels,
                              outcome=outcome, correlation_id=correlation_id, producer=producer, cause=cause,
                              trace=trace, occurred_at=occurred_at)


def run_event_envelope(*, tenant_id: str, run_id: str, seq: int, event_type: str, status: str,
                       data: dict[str, Any], labels: Mapping[str, str], outcome: dict[str, Any] | None,
                       correlation_id: str | None, producer: str, cause: str, trace: str | None,
                       occurred_at: str | None = None) -> dict[str, Any]:
    """A ``run.event`` envelope in JSON form, public, with a fresh id, at the time now unless given
    (ISO 8601 text): every ``run.event`` is made here."""
    return {"event_id": new_event_id(), "type": RUN_EVENT, "schema_version": LATEST[RUN_EVENT],
            "producer": producer, "tenant_id": tenant_id, "trace": trace, "run_id": run_id, "step_id": None,
            "attempt_id": None, "causation_id": cause, "correlation_id": correlation_id,
            "expected_state_version": None, "occurred_at": occurred_at or utcnow().isoformat(),
            "data_class": DataClass.PUBLIC.value,
            "payload": {"seq": seq, "event_type": event_type, "status": status, "data": data, "labels": dict(labels),
                        "outcome": outcome}}


def _parsed(envelope: dict[str, Any]) -> Envelope:
    return ENVELOPES[(envelope["type"], envelope["schema_version"])].model_validate(envelope)


def status_route(tenant_id: str, status: str) -> tuple[str, str]:
    """Where a status change of a run of ``tenant_id`` to ``status`` is published: exchange and routing key."""
    return topology.EVENTS_EXCHANGE, topology.status_key(tenant_id, status)


def run_outcome(run: RunSnapshot, public: PublicReceipts) -> dict[str, Any]:
    """How a finished run ended, as far as the outside world may see it: its reason, the evidence
    its acceptance check passed on, and per confirmed action the external id plus the receipt
    fields its tool declares public."""
    receipts = []
    for action in run.actions:
        if action.status not in closure.DONE:
            continue
        fact = run.fact(f"{RECEIPT_FACT_PREFIX}{action.logical_action}")
        receipt = fact.value if fact is not None and isinstance(fact.value, Mapping) else {}
        receipts.append({"logical_action": action.logical_action, "tool": action.tool,
                         "external_id": action.external_id,
                         "fields": {k: thaw(receipt[k]) for k in public.get(action.tool, ()) if k in receipt}})
    acceptance = run.acceptance
    return {"status": run.status.value, "terminal_reason": run.terminal_reason,
            "acceptance": None if acceptance is None else {"evidence": thaw(acceptance.evidence),
                                                            "unmet": list(acceptance.unmet)},
            "receipts": receipts, "summary": thaw(closure.summarize(run))}


def correction_message(stored: StoredRun, event: ev.CorrectionNeeded, *, producer: str,
                       cause: str) -> Message:
    """A correction a COMPLETED run needs, for downstream consumers: public, like its status events,
    naming the action and why (the far side's ids, never a receipt's private fields)."""
    run = stored.snapshot
    envelope = run_event_envelope(tenant_id=run.tenant_id, run_id=run.run_id, seq=event.seq, event_type=event.type,
                                  status=run.status.value,
                                  data={"logical_action": event.logical_action, "reason": event.reason,
                                        "evidence": thaw(event.evidence)},
                                  labels=thaw(run.labels), outcome=None, correlation_id=run.correlation_id,
                                  producer=producer, cause=cause, trace=traceparent())
    return Message(_parsed(envelope), *status_route(run.tenant_id, run.status.value), stored.partition)


def accepted_message(create: Envelope, *, run_id: str, partition: int, workflow: str, versions: PinnedVersions,
                     labels: Mapping[str, str], repeated: bool, producer: str,
                     outcome: Mapping[str, Any] | None = None) -> Message:
    """The answer to a ``run.create``: the run it made (or, repeated, had made, with its ``outcome``
    if it has ended), on the run's partition so it is published before the run's status events."""
    key = create.payload.idempotency_key
    envelope = make("run.accepted", {"run_id": run_id, "idempotency_key": key, "workflow": workflow,
                                     "versions": to_plain(versions), "labels": dict(labels), "repeated": repeated,
                                     "outcome": outcome},
                    producer=producer, tenant_id=create.tenant_id, run_id=run_id,
                    correlation_id=create.correlation_id or key, causation_id=create.event_id,
                    data_class=DataClass.PUBLIC)
    return Message(envelope, topology.EVENTS_EXCHANGE, topology.event_key(create.tenant_id, "accepted"),
                          partition)


def rejected_message(*, tenant_id: str, correlation_id: str | None, refused_event_id: str,
                     idempotency_key: str | None, code: RejectionCode | SignalRejectionCode, reason: str,
                     partitions: int, producer: str,
                     **details: Any) -> Message:
    """The answer to a refused ``run.create`` or ``run.signal``: why, for machines (``code``) and people (``reason``)."""
    envelope = make("run.rejected", {"code": code, "reason": reason, "idempotency_key": idempotency_key,
                                     "refused_event_id": refused_event_id, **details},
                    producer=producer, tenant_id=tenant_id, correlation_id=correlation_id,
                    causation_id=refused_event_id, data_class=DataClass.PUBLIC)
    return Message(envelope, topology.EVENTS_EXCHANGE, topology.event_key(tenant_id, "rejected"),
                          topology.partition_of(refused_event_id, partitions))


@dataclass(frozen=True, slots=True)
class SlotHandover:
    """How a writer hands a finishing run's slot on (``runs.Handover``): the scheduler's tenant slots
    and aging, and the bus's partition count."""

    slots: int
    aging_seconds: float
    partitions: int


@dataclass(frozen=True, slots=True)
class TenantBudgets:
    """How a writer charges a model call to its tenant's period (``runs.TenantCharge``): the period's
    length and the platform's default budgets (``None``: unlimited)."""

    period: float
    tokens_default: int | None
    cost_default: float | None


def tenant_charge(tenant_id: str, events: Sequence[ev.RunEvent], budgets: TenantBudgets | None) -> TenantCharge | None:
    """The tenant's share of the model calls ``events`` charge; None when they charge no token or cost."""
    charged = [e for e in events if isinstance(e, ev.BudgetCharged) and (e.tokens or e.cost)]
    if budgets is None or not charged:
        return None
    return TenantCharge(tenant_id, sum(e.tokens for e in charged), sum(e.cost for e in charged), budgets.period,
                        budgets.tokens_default, budgets.cost_default)


def broadcast_rides(before: RunSnapshot, after: StoredRun, *, producer: str, cause: str,
                    public: PublicReceipts = EXTERNAL_IDS_ONLY, handover: SlotHandover | None = None) -> Rides:
    """``broadcast`` as rows riding with the transition's own statement (``runs.write``); with
    ``handover``, a run that finishes, or parks in a wait that holds no slot (``domain.slots``),
    gives its slot to the next queued run of its tenant at once instead of waking admission."""
    message = broadcast_message(before, after, producer=producer, cause=cause, public=public)
    run = after.snapshot
    frees = (message is not None and run.status in TERMINAL) or slots.gives_slot_back(before, run)
    messages = () if message is None else (message,)
    if not frees:
        return Rides(messages=messages)
    if handover is None:
        return Rides(messages=messages, notices=((ADMISSION_CHANNEL, run.tenant_id),))
    wake = {"tenant_id": run.tenant_id, "reason": "admitted", "cause": f"slot:{run.run_id}", "producer": producer,
            "trace": traceparent()}
    routes = {k: wakeup_route(k)[1] for k in range(handover.partitions)}
    return Rides(messages=messages, handover=Handover(run.tenant_id, handover.slots, handover.aging_seconds,
                                                        wake, wakeup_route(0)[0], routes,
                                                        ADMISSION_CHANNEL))
