"""The public names on the bus: where a producer publishes and where a tenant's events arrive.

The runtime declares these (its topology imports them from here); a producer only publishes to
the ingress exchange and binds its own queue to its tenant's keys on the events exchange.
"""

from __future__ import annotations

from longrun_client.model import TENANT_PATTERN

__all__ = ["CONSUMER_NAME_PATTERN", "CREATE_KEY", "EVENTS_EXCHANGE", "EVENTS_LOG_QUEUE", "INGRESS_EXCHANGE",
           "TENANT_PATTERN", "TERMINAL_STATUSES", "consumer_lost_queue", "consumer_queue", "event_key", "status_key",
           "tenant_pattern"]

INGRESS_EXCHANGE = "longrun.ingress"
CREATE_KEY = "run.create"
EVENTS_EXCHANGE = "longrun.events"
EVENTS_LOG_QUEUE = "longrun.events.log"
TERMINAL_STATUSES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TERMINATED", "TIMED_OUT", "BUDGET_EXHAUSTED"})
"""A run.event with one of these statuses is the run's last; it carries the outcome."""


def event_key(tenant_id: str, event: str) -> str:
    """Routing key of a run event on ``EVENTS_EXCHANGE``: ``<tenant>.run.accepted``,
    ``<tenant>.run.rejected``, ``<tenant>.run.status.<status in lower case>``."""
    return f"{tenant_id}.run.{event}"


def status_key(tenant_id: str, status: str) -> str:
    return event_key(tenant_id, f"status.{status.lower()}")


def tenant_pattern(tenant_id: str) -> str:
    """The binding that takes every event of one tenant (and only that tenant: ids have no dots)."""
    return event_key(tenant_id, "#")


CONSUMER_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
"""A durable consumer's name: lower case, digits, '_' and '-' (no dots: the queue name is parsed by them)."""


def consumer_queue(tenant_id: str, name: str) -> str:
    """The durable queue of a tenant's named consumer; the tenant's prefix lets its broker user own it."""
    return f"{tenant_id}.consumer.{name}"


def consumer_lost_queue(tenant_id: str, name: str) -> str:
    """Where the broker dead-letters what it dropped from ``consumer_queue`` (the name of the fanout
    exchange into it too), so the consumer can report the loss."""
    return f"{consumer_queue(tenant_id, name)}.lost"
