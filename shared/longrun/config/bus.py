"""RabbitMQ: the connection, consumers' flow and the outbox relay's pace."""

from __future__ import annotations

from dataclasses import dataclass

from longrun.config import parse
from longrun.config.declaration import Concern, setting

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"


def _amqp_url(raw: str) -> str:
    scheme, sep, rest = raw.partition("://")
    hosts = rest.partition("/")[0].rpartition("@")[2]
    if not sep or scheme not in ("amqp", "amqps") or not all(h.strip() for h in hosts.split(",")):
        raise ValueError
    return raw


@dataclass(frozen=True)
class BusSettings(Concern):
    """Bus: RabbitMQ and the outbox relay"""

    amqp_url: str = setting("LONGRUN_AMQP_URL", _amqp_url,
                            "an amqp:// or amqps:// URL (a cluster: amqp://user:pass@node1:5672,node2:5672/vhost)",
                            DEFAULT_AMQP_URL, secret=True)
    """RabbitMQ URL; a cluster's nodes as ``host1:port,host2:port`` in its host part."""
    prefetch: int = setting("LONGRUN_PREFETCH", parse.positive_int, "an integer >= 1", "100")
    """Unacked deliveries per consumer channel."""
    amqp_heartbeat: int = setting("LONGRUN_AMQP_HEARTBEAT", parse.positive_int, "seconds, an integer >= 1", "10")
    """Seconds between AMQP heartbeats; a frozen replica loses its queues after about two missed ones."""
    delivery_limit: int = setting("LONGRUN_DELIVERY_LIMIT", parse.positive_int, "an integer >= 1", "5")
    """Deliveries of one message before the broker dead-letters it to quarantine."""
    relay_poll_interval: float = setting("LONGRUN_RELAY_POLL_INTERVAL", parse.positive_float,
                                         "seconds, a number > 0", "1")
    """Seconds between outbox polls when no NOTIFY arrives."""
    relay_batch: int = setting("LONGRUN_RELAY_BATCH", parse.positive_int, "an integer >= 1", "200")
    """Outbox rows claimed per relay round."""
    eager_publish_grace: float = setting("LONGRUN_EAGER_PUBLISH_GRACE", parse.non_negative_float,
                                         "seconds, a number >= 0", "0")
    """Above 0, a worker publishes its own run's messages right after their commit, and the relay
    leaves them to it for these seconds (past them, after a crash or with the broker away, the relay
    publishes them); 0, the default, leaves every message to the relay. Off by default: on a two-core
    machine, where the worker is the busiest process, it has not yet measured faster than the relay."""
    ingress_max_length: int = setting("LONGRUN_INGRESS_MAX_LENGTH", parse.positive_int, "an integer >= 1", "100000")
    """run.create messages the ingress queue holds; past it the broker nacks new creates. A RabbitMQ
    policy the scheduler sets at every start: see [flow control](flow-control.md#backpressure-at-the-door)."""
    ingress_max_bytes: int = setting("LONGRUN_INGRESS_MAX_BYTES", parse.positive_int, "bytes, an integer >= 1",
                                     "104857600")
    """Bytes of message bodies the ingress queue holds (100 MiB); past it the broker nacks new creates.
    Keep it well under the broker's memory high watermark."""
    rabbitmq_management_url: str = setting(
        "LONGRUN_RABBITMQ_MANAGEMENT_URL", parse.optional_url,
        "an http(s) URL of RabbitMQ's management API with a user and password, or empty", "", secret=True)
    """Where the scheduler sets the ingress queue's bound (a user tagged ``policymaker`` or
    ``administrator``); empty: ``LONGRUN_AMQP_URL``'s first node on port 15672 over http, with its
    user and password."""
