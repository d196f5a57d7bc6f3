"""The RabbitMQ topology, declared as data and applied idempotently by every service.

- ``longrun.ingress`` (topic): producers publish ``run.create`` and ``run.signal`` here from any
  AMQP client, each with its type as the routing key; the scheduler consumes both from one queue,
  ``longrun.scheduler.ingress``.
- ``longrun.work.worker`` (direct): the worker's wakeups in P partitions. The publisher
  computes ``partition_of(run_id, P)`` and uses routing key ``p.<k>``; each partition
  is a quorum queue with single-active-consumer, an explicit delivery-limit (3.10 has
  no default) and at-least-once dead-lettering into the quarantine. Only the worker is
  partitioned: nothing a producer sets says which tenant and key a ``run.create`` is for
  before the scheduler reads it.
- ``longrun.quarantine`` (fanout): poison messages, with their reason in headers.
- ``longrun.events`` (topic): run events for the outside world, routing key
  ``<tenant>.run.<event>`` (``event_key``), so a consumer binds its own tenant's keys only and
  RabbitMQ's topic permissions can hold it there; a stream keeps a replayable log so a publish
  is never unroutable.
- ``longrun.progress`` (fanout, transient): live progress of calls (model output chunks, heartbeat
  details), published non-persistent by workers and read by each gateway replica through an
  exclusive, auto-delete, length-bounded queue of its own (``longrun.bus.progress``). Nothing on it
  is history: a message lost or dropped is a gap the reader reports, never a changed run.

The ingress queue's bound (length and bytes) is a policy, ``ingress_policy``, not a queue
argument: a quorum queue's arguments cannot change in place and every service declares the
queue, while a policy applies to the queue that exists and changes with the settings. The
scheduler sets it at start (``longrun.bus.management``); the definitions file carries it too.

``infra/rabbitmq/definitions.json`` is generated from this module (``make topology``);
a test fails when the two drift. Changing P is a drain-and-switch migration.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

# The names producers and consumers outside the runtime use are defined with the public contract.
from longrun_client.bus import (
    EVENTS_EXCHANGE as EVENTS_EXCHANGE,
    EVENTS_LOG_QUEUE as EVENTS_LOG_QUEUE,
    INGRESS_EXCHANGE as INGRESS_EXCHANGE,
    TENANT_PATTERN as TENANT_PATTERN,
    event_key as event_key,
    status_key as status_key,
)

SCHEDULER_INGRESS_QUEUE = "longrun.scheduler.ingress"
INGRESS_TYPES = ("run.create", "run.signal")
"""What producers publish on the ingress; each is its own routing key (the tenant users' topic permission)."""
QUARANTINE_EXCHANGE = "longrun.quarantine"
QUARANTINE_QUEUE = "longrun.quarantine"
PROGRESS_EXCHANGE = "longrun.progress"
PARTITIONED_SERVICES = ("worker",)
VHOST = "/"


def partition_of(run_id: str, partitions: int) -> int:
    """Stable across processes, languages and broker restarts (unlike Python's hash())."""
    digest = hashlib.blake2b(run_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def work_exchange(service: str) -> str:
    return f"longrun.work.{service}"


def partition_queue(service: str, partition: int) -> str:
    return f"longrun.{service}.p{partition}"


def partition_key(partition: int) -> str:
    return f"p.{partition}"


@dataclass(frozen=True, slots=True)
class ExchangeSpec:
    name: str
    type: str
    arguments: dict[str, Any] = field(default_factory=dict)
    durable: bool = True
    """False: a transient exchange, gone with a broker restart and declared again by every service."""


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class BindingSpec:
    exchange: str
    queue: str
    routing_key: str


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str
    pattern: str
    definition: dict[str, Any]
    priority: int
    apply_to: str = "queues"


INGRESS_POLICY = "longrun-ingress-bound"
INGRESS_POLICY_PRIORITY = 10
"""RabbitMQ applies one policy to a queue, the matching one of highest priority: an operator's
catch-all policy (priority 0) does not displace this one."""


def ingress_policy(*, max_length: int, max_bytes: int) -> PolicySpec:
    """The ingress queue's bound. ``overflow`` is set here too: for it a policy wins over the queue's
    argument, and with ``drop-head`` a full queue would drop accepted creates instead of nacking new
    ones. For ``max-length`` and ``max-length-bytes`` the lower of the policy and an argument holds."""
    return PolicySpec(INGRESS_POLICY, f"^{re.escape(SCHEDULER_INGRESS_QUEUE)}$",
                      {"max-length": max_length, "max-length-bytes": max_bytes, "overflow": "reject-publish"},
                      INGRESS_POLICY_PRIORITY)


@dataclass(frozen=True, slots=True)
class Topology:
    exchanges: tuple[ExchangeSpec, ...]
    queues: tuple[QueueSpec, ...]
    bindings: tuple[BindingSpec, ...]


def quorum_arguments(delivery_limit: int, *, single_active: bool) -> dict[str, Any]:
    args: dict[str, Any] = {
        "x-queue-type": "quorum",
        # Set explicitly: RabbitMQ 3.x has no default, and with a limit a requeued
        # message keeps its place, which per-run order relies on.
        "x-delivery-limit": delivery_limit,
        "x-dead-letter-exchange": QUARANTINE_EXCHANGE,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }
    if single_active:
        args["x-single-active-consumer"] = True
    return args


def build(*, partitions: int, delivery_limit: int) -> Topology:
    exchanges = [
        ExchangeSpec(INGRESS_EXCHANGE, "topic"),
        ExchangeSpec(QUARANTINE_EXCHANGE, "fanout"),
        ExchangeSpec(EVENTS_EXCHANGE, "topic"),
        ExchangeSpec(PROGRESS_EXCHANGE, "fanout", durable=False),
    ]
    queues = [
        QueueSpec(SCHEDULER_INGRESS_QUEUE, quorum_arguments(delivery_limit, single_active=False)),
        QueueSpec(QUARANTINE_QUEUE, {"x-queue-type": "quorum"}),
        QueueSpec(EVENTS_LOG_QUEUE, {"x-queue-type": "stream", "x-max-age": "7D"}),
    ]
    bindings = [
        *(BindingSpec(INGRESS_EXCHANGE, SCHEDULER_INGRESS_QUEUE, key) for key in INGRESS_TYPES),
        BindingSpec(QUARANTINE_EXCHANGE, QUARANTINE_QUEUE, ""),
        BindingSpec(EVENTS_EXCHANGE, EVENTS_LOG_QUEUE, "#"),
    ]
    for service in PARTITIONED_SERVICES:
        exchanges.append(ExchangeSpec(work_exchange(service), "direct"))
        for k in range(partitions):
            queue = partition_queue(service, k)
            queues.append(QueueSpec(queue, quorum_arguments(delivery_limit, single_active=True)))
            bindings.append(BindingSpec(work_exchange(service), queue, partition_key(k)))
    return Topology(tuple(exchanges), tuple(queues), tuple(bindings))


def definitions(topology: Topology, policies: tuple[PolicySpec, ...] = ()) -> dict[str, Any]:
    """RabbitMQ definitions-file form (importable with rabbitmqctl import_definitions)."""
    return {
        "vhosts": [{"name": VHOST}],
        "exchanges": [
            {"name": e.name, "vhost": VHOST, "type": e.type, "durable": e.durable,
             "auto_delete": False, "internal": False, "arguments": e.arguments}
            for e in topology.exchanges
        ],
        "queues": [
            {"name": q.name, "vhost": VHOST, "durable": True, "auto_delete": False,
             "arguments": q.arguments}
            for q in topology.queues
        ],
        "bindings": [
            {"source": b.exchange, "vhost": VHOST, "destination": b.queue,
             "destination_type": "queue", "routing_key": b.routing_key, "arguments": {}}
            for b in topology.bindings
        ],
        "policies": [
            {"name": p.name, "vhost": VHOST, "pattern": p.pattern, "apply-to": p.apply_to,
             "definition": p.definition, "priority": p.priority}
            for p in policies
        ],
    }


def render_definitions(*, partitions: int, delivery_limit: int, ingress_max_length: int,
                       ingress_max_bytes: int) -> str:
    topology = build(partitions=partitions, delivery_limit=delivery_limit)
    bound = ingress_policy(max_length=ingress_max_length, max_bytes=ingress_max_bytes)
    return json.dumps(definitions(topology, (bound,)), indent=2, sort_keys=True) + "\n"
