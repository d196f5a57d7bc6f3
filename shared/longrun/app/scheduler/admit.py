"""The scheduler's use cases: create runs idempotently, then admit them fairly.

Creation is keyed on (tenant, idempotency_key): the same key again returns the same
run; the same key with a different input is refused with a ``run.rejected`` event that
names both input hashes. A run is created with its scope (its kind's maximum narrowed by
its tenant's policy and by the request, ``domain.scope.narrow``) and, if the request has a
deadline, its ``business_deadline`` timer, in the creating statement. Admission gives each
tenant at most ``slots`` admitted, unfinished runs, and picks within a tenant by priority plus age (one priority point per
``aging_seconds`` waited), so a low-priority run is never starved. A per-tenant
advisory lock keeps several scheduler replicas from over-admitting; a transaction that takes
several tenants' locks (a batch of creates, an admission round) takes them in tenant order, so
two of them cannot deadlock.

A run created while its tenant has a free slot and no run waiting is admitted in its
creating statement: the choice is the one admission would make, without a NOTIFY and
another transaction between the create and the worker's wakeup (latency to the first step).
A run that a worker finishes hands its slot to the next queued run of its tenant in the
statement that finishes it (``runs.Handover``), which admits and wakes that run; admission
is notified only when nobody could take the slot.

A run kind's concurrency key (``authoring.ConcurrencyKey``) is derived from the create's input and
stored with the run; its policy may refuse the create or cancel the key's earlier runs first
(``scheduler.keys``). A queued run whose key its holders fill is passed over by admission, and takes
the key when a holder ends.
"""

from __future__ import annotations

import dataclasses
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from longrun import metrics
from longrun.app import effects
from longrun.app.scheduler import keys
from longrun.authoring import ConcurrencyKey, Registry, RunKind
from longrun.bus import topology
from longrun.domain import TERMINAL, RunTimeouts, Scope, TenantPolicy, Usage, evolve, freeze, narrow, request_hash
from longrun.domain import events as ev
from longrun.domain.concurrency import KeyClaim
from longrun.domain.timeouts import resolve
from longrun.envelope import Envelope
from longrun.envelope.model import TENANT_PATTERN
from longrun.envelope.payloads import RejectionCode, RunScope
from longrun.envelope.payloads import RunTimeouts as RunTimeoutsV4
from longrun.ports.runs import AtOnce, Found
from longrun.ports.stores import RunTransaction
from longrun_client.storable import unstorable

PRODUCER = "scheduler"


def input_hash(payload: Any) -> str:
    """What makes two run.create requests "the same": workflow, pin, input, priority, budget and, when
    asked for, scope, deadline and timeouts (a request without them hashes as it did before they existed)."""
    args = {"workflow": payload.workflow, "workflow_version": payload.workflow_version,
            "input": payload.input, "priority": payload.priority, "budget": payload.budget.model_dump()}
    if payload.scope is not None:
        args["scope"] = payload.scope.model_dump()
    if payload.deadline is not None:
        args["deadline"] = payload.deadline.timestamp()
    if payload.timeouts is not None:
        args["timeouts"] = payload.timeouts.model_dump()
    return request_hash("run.create", "2", args=args)


def requested_scope(scope: RunScope | None) -> Scope | None:
    """The producer's narrowing as a ``Scope``; a dimension it leaves out is not narrowed."""
    if scope is None:
        return None
    everything = Scope()
    return Scope(tuple(scope.tools) if scope.tools is not None else everything.tools,
                 tuple(scope.resources) if scope.resources is not None else everything.resources)


def requested_timeouts(timeouts: RunTimeoutsV4 | None) -> RunTimeouts | None:
    """The producer's timeouts as the domain's; what it leaves out is the run kind's (``timeouts.resolve``)."""
    if timeouts is None:
        return None
    return RunTimeouts(schedule_to_start=timeouts.schedule_to_start, start_to_close=timeouts.start_to_close)


def new_run_id() -> str:
    return f"run-{uuid.uuid4()}"


@dataclass(frozen=True, slots=True)
class Answered:
    """What a create did (``outcome``: the ingress's inbox records it) and the answer sent for it
    (``answer``: the run.accepted or run.rejected envelope, which the gateway's ``POST /runs`` returns too)."""

    outcome: dict[str, Any]
    answer: Envelope


@dataclass(frozen=True, slots=True)
class Locked:
    """The transaction holds the tenant's admission lock already, and read its policy with it."""

    policy: TenantPolicy | None


async def create_run(tx: RunTransaction, envelope: Envelope, *, kinds: Registry, partitions: int, slots: int,
                     max_input_bytes: int, clock: Any = time.time, locked: Locked | None = None,
                     new_id: Callable[[], str] = new_run_id, overlap: ConcurrencyKey | None = None) -> Answered:
    """Create the run ``envelope`` asks for and announce it (``run.accepted``), or refuse it
    (``run.rejected``): the one admission of every run, whether its create came on the bus (the
    scheduler's ingress) or over HTTP (the gateway's ``POST /runs``). ``locked``: the transaction holds the tenant's admission lock already and
    read its policy with it (the ingress consumer's prelude, ``Ingress.prelude``), so neither is
    asked for again: one round trip less. ``overlap``: a schedule's overlap key, which its runs take in
    place of their kind's (``domain.schedules``)."""
    request = envelope.payload
    offered = input_hash(request)
    kind = _kind_for(request, kinds, max_input_bytes)
    if overlap is not None and not isinstance(kind, Refusal):
        kind = dataclasses.replace(kind, concurrency=overlap)
    claim = None if isinstance(kind, Refusal) else _claim(kind, request.input)
    refusal = kind if isinstance(kind, Refusal) else claim if isinstance(claim, Refusal) else None
    if refusal is not None:
        found = await tx.find(envelope.tenant_id, request.idempotency_key)
        if found is not None:  # created while it was acceptable: the run stands
            return await _existing(tx, envelope, found, offered, partitions, kinds)
        return await _reject(tx, envelope, partitions, refusal)
    assert not isinstance(kind, Refusal) and not isinstance(claim, Refusal)
    # Admission's lock first: the creating statement's count of the tenant's slots is then the one
    # admission would see, and the run is admitted in it (no NOTIFY and no second transaction
    # between the create and the worker's wakeup). The tenant's policy comes with it.
    if locked is None:
        locked = Locked(await tx.lock_tenant(envelope.tenant_id))
    run_id = new_id()
    if claim is not None and keys.reads(kind):
        # A repeated create is answered with its run before the key's policy counts that very run.
        found = await tx.find(envelope.tenant_id, request.idempotency_key)
        if found is not None:
            return await _existing(tx, envelope, found, offered, partitions, kinds)
        held = await keys.apply_policy(tx, kind, claim, tenant_id=envelope.tenant_id, run_id=run_id, clock=clock)
        if held is not None:
            return await _reject(tx, envelope, partitions, Refusal(RejectionCode.CONCURRENCY_KEY_HELD, held))
    # The run's scope: what its kind allows, narrowed by its tenant's policy and by the producer.
    permissions = narrow(kind.scope, locked.policy, requested_scope(request.scope))
    created = ev.RunCreated(
        seq=1, at=clock(), run_id=run_id, tenant_id=envelope.tenant_id, kind=kind.name,
        goal=freeze(request.input), versions=kind.versions, priority=request.priority,
        budget=Usage(model_calls=request.budget.model_calls, tool_calls=request.budget.tool_calls,
                     cost=request.budget.cost_usd),
        permissions=permissions, deadline=request.deadline.timestamp() if request.deadline is not None else None,
        timeouts=resolve(requested_timeouts(request.timeouts), kind.timeouts),
        labels=freeze(request.labels), correlation_id=envelope.correlation_id or request.idempotency_key)
    partition = topology.partition_of(run_id, partitions)
    wakeup = effects.wake_message_of(tenant_id=envelope.tenant_id, run_id=run_id,
                                     revision=evolve(None, created).revision, partition=partition,
                                     reason="admitted", producer=PRODUCER, cause=envelope.event_id)
    accepted = effects.accepted_message(envelope, run_id=run_id, partition=partition, workflow=kind.name,
                                        versions=kind.versions, labels=request.labels, repeated=False,
                                        producer=PRODUCER)
    stored = await tx.create(created, idempotency_key=request.idempotency_key, input_hash=offered,
                             partition=partition, announce=[accepted],
                             at_once=AtOnce(slots, wakeup, effects.ADMISSION_CHANNEL), key=claim)
    if stored is None:  # the key exists (a repeated request, or a concurrent create won the insert)
        found = await tx.find(envelope.tenant_id, request.idempotency_key)
        assert found is not None
        return await _existing(tx, envelope, found, offered, partitions, kinds)
    if stored.admitted:
        metrics.ADMISSION_DELAY.labels(kind.name).observe(max(0.0, clock() - envelope.occurred_at.timestamp()))
        return Answered({"run_id": run_id, "created": True, "admitted": True}, accepted.envelope)
    return Answered({"run_id": run_id, "created": True}, accepted.envelope)


async def refuse_publisher(tx: RunTransaction, envelope: Envelope, publisher: str | None, *,
                           partitions: int) -> Answered:
    """A create its publisher may not make (``longrun.services.scheduler.producers``): answered on the create's
    tenant and audited with the publisher, never quarantined."""
    reason = (f"the publisher may not create runs in tenant {envelope.tenant_id!r}" if publisher is not None
              else "the run.create names no publisher: set its AMQP user_id to the connection's user")
    await tx.audit(actor=f"broker-user:{publisher or '-'}", action="run.create.refused", target=envelope.tenant_id,
                   reason=reason, details={"publisher": publisher, "event_id": envelope.event_id,
                                           "idempotency_key": envelope.payload.idempotency_key})
    return await _reject(tx, envelope, partitions, Refusal(RejectionCode.TENANT_NOT_ALLOWED, reason))


@dataclass(frozen=True, slots=True)
class Refusal:
    code: RejectionCode
    reason: str
    details: Mapping[str, Any] = field(default_factory=dict)


INPUT_PROBLEMS_TOLD = 10
"""Input problems a refusal names; the rest are counted."""


LARGEST_STORED_INTEGER = 2**63 - 1
"""JSON allows any integer and any depth; the run's JSONB columns are written through orjson, which takes
64-bit integers and 255 levels."""


def _kind_for(request: Any, kinds: Registry, max_input_bytes: int) -> RunKind | Refusal:
    """The run kind a create asks for, or why it is refused."""
    try:
        size = len(orjson.dumps(request.input))
    except TypeError as e:  # orjson's refusal: an integer past 64 bits, or nesting past its depth
        return Refusal(RejectionCode.INVALID_PAYLOAD, f"input cannot be stored: {e}")
    if max(request.budget.model_calls, request.budget.tool_calls) > LARGEST_STORED_INTEGER:
        return Refusal(RejectionCode.INVALID_PAYLOAD, f"budget call limits are at most {LARGEST_STORED_INTEGER}")
    if size > max_input_bytes:
        return Refusal(RejectionCode.INPUT_TOO_LARGE,
                       f"input is {size} bytes of JSON; at most {max_input_bytes} are accepted "
                       "(put large inputs in the artifact store and pass their reference)")
    if not kinds.known(request.workflow):
        return Refusal(RejectionCode.UNKNOWN_WORKFLOW, f"unknown workflow {request.workflow!r}")
    try:
        kind = (kinds.get(request.workflow, request.workflow_version) if request.workflow_version
                else kinds.newest(request.workflow))
    except LookupError as e:
        return Refusal(RejectionCode.UNKNOWN_WORKFLOW_VERSION, str(e))
    if problems := kind.input_problems(request.input):
        more = f"; and {len(problems) - INPUT_PROBLEMS_TOLD} more" if len(problems) > INPUT_PROBLEMS_TOLD else ""
        return Refusal(RejectionCode.INPUT_INVALID, f"input does not match the input schema of {kind.name!r} "
                       f"v{kind.versions.workflow}: {'; '.join(problems[:INPUT_PROBLEMS_TOLD])}{more}")
    return kind


def _claim(kind: RunKind, value: Any) -> KeyClaim | None | Refusal:
    """The concurrency key a run of ``kind`` with input ``value`` claims, or why its input gives none."""
    try:
        return keys.claim_of(kind, value)
    except ValueError as e:
        return Refusal(RejectionCode.INPUT_INVALID, f"input gives {kind.name!r} no concurrency key: {e}")


async def _existing(tx: RunTransaction, envelope: Envelope, found: Found, offered: str,
                    partitions: int, kinds: Registry) -> Answered:
    """A repeated create: announced again (a new event, the same run), or refused if its input differs.
    A run that has ended is announced with its outcome: its terminal event is not published again,
    so the repeat's producer would otherwise wait for it forever."""
    if found.input_hash != offered:
        return await _reject(tx, envelope, partitions, Refusal(
            RejectionCode.IDEMPOTENCY_KEY_REUSED, "idempotency key reused with a different input",
            {"existing_run_id": found.run_id, "recorded_input_hash": found.input_hash,
             "offered_input_hash": offered}))
    stored = await tx.load(found.run_id)
    outcome = None
    if stored is not None and stored.snapshot.status in TERMINAL:
        outcome = effects.run_outcome(stored.snapshot, kinds.public_receipts(found.workflow, found.versions.workflow))
    accepted = effects.accepted_message(
        envelope, run_id=found.run_id, partition=found.partition, workflow=found.workflow, versions=found.versions,
        labels=found.labels, repeated=True, producer=PRODUCER, outcome=outcome)
    await tx.send([accepted])
    return Answered({"run_id": found.run_id, "created": False}, accepted.envelope)


async def _reject(tx: RunTransaction, envelope: Envelope, partitions: int, refusal: Refusal) -> Answered:
    rejected = effects.rejected_message(
        tenant_id=envelope.tenant_id, correlation_id=envelope.correlation_id or envelope.payload.idempotency_key,
        refused_event_id=envelope.event_id, idempotency_key=envelope.payload.idempotency_key, code=refusal.code,
        reason=refusal.reason, partitions=partitions, producer=PRODUCER, **refusal.details)
    await tx.send([rejected])
    return Answered({"rejected": True, "code": refusal.code.value, "reason": refusal.reason, **refusal.details},
                    rejected.envelope)


@dataclass(frozen=True, slots=True)
class Outer:
    """What a refused run.create's envelope says of its producer, read without its payload's schema."""

    tenant_id: str
    event_id: str
    correlation_id: str | None
    idempotency_key: str | None


def readable_outer(body: bytes) -> Outer | None:
    """The outer fields of a run.create that did not decode, if they name a valid tenant and an id."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or data.get("type") != "run.create":
        return None
    tenant, event_id = data.get("tenant_id"), _text(data.get("event_id"))
    if not isinstance(tenant, str) or not re.fullmatch(TENANT_PATTERN, tenant) or event_id is None:
        return None
    payload = data.get("payload")
    key = _text(payload.get("idempotency_key")) if isinstance(payload, dict) else None
    correlation = _text(data.get("correlation_id"))
    return Outer(tenant, event_id, correlation if correlation is not None else key, key)


def _text(value: Any) -> str | None:
    """A string the answer can carry (PostgreSQL keeps it in the outbox), else None."""
    return value if isinstance(value, str) and unstorable(value) is None else None
