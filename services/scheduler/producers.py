"""Producers bound to their tenants: which broker users may create runs in which tenants.

RabbitMQ checks a message's AMQP ``user_id`` property against the user of the connection that
publishes it (a mismatch closes the channel), so a ``user_id`` that reaches the ingress names its
publisher. The ingress admits a ``run.create`` only when that user may create runs in the
create's tenant (``LONGRUN_PRODUCER_TENANTS``); a create naming no ``user_id`` names no publisher
and is refused too. The runtime's own user may create in every tenant: it reads and writes every
queue of the vhost already. ``guest``, RabbitMQ's development user, only when the broker is on
this machine (RabbitMQ's own rule for it: ``loopback_users``).

A refusal is answered (``run.rejected``, ``tenant_not_allowed``) and audited, never quarantined:
replaying a quarantined create would publish it again as the runtime, without its publisher.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from longrun_client.codec import DEVELOPMENT_USER, broker_user

from longrun.bus.connection import node_urls
from longrun.envelope.model import TENANT_PATTERN
from longrun.errors import ConfigError

EVERY_TENANT = "*"
SETTING = "LONGRUN_PRODUCER_TENANTS"


@dataclass(frozen=True, slots=True)
class ProducerTenants:
    """Broker user -> the tenants it may create runs in (``*``: every tenant)."""

    by_user: Mapping[str, frozenset[str]]

    def allows(self, user: str | None, tenant: str) -> bool:
        if user is None:
            return False
        tenants = self.by_user.get(user, frozenset())
        return EVERY_TENANT in tenants or tenant in tenants


def on_this_machine(url: str) -> bool:
    """Every node of the AMQP URL is a loopback address: a development broker."""
    for node in node_urls(url):
        host = urlsplit(node).hostname or ""
        if host != "localhost":
            try:
                if not ipaddress.ip_address(host).is_loopback:
                    return False
            except ValueError:
                return False
    return True


def producer_tenants(pairs: tuple[tuple[str, str], ...], amqp_url: str) -> ProducerTenants:
    """The grants of ``LONGRUN_PRODUCER_TENANTS`` plus the runtime's own user; ConfigError naming
    each pair that is not a user and a tenant (or ``*``), and ``guest`` away from development."""
    problems = [f"{user}={tenant}: {tenant!r} is neither a tenant id nor *" for user, tenant in pairs
                if tenant != EVERY_TENANT and not re.fullmatch(TENANT_PATTERN, tenant)]
    development = on_this_machine(amqp_url)
    if not development and any(user == DEVELOPMENT_USER for user, _ in pairs):
        problems.append(f"{DEVELOPMENT_USER!r} may create runs only in development (a broker on this machine, "
                        "as LONGRUN_AMQP_URL names it); give the producer a user of its own")
    if problems:
        raise ConfigError([(SETTING, problem) for problem in problems])
    grants: dict[str, set[str]] = {}
    for user, tenant in pairs:
        grants.setdefault(user, set()).add(tenant)
    runtime = broker_user(amqp_url)
    if runtime != DEVELOPMENT_USER or development:
        grants.setdefault(runtime, set()).add(EVERY_TENANT)
    return ProducerTenants({user: frozenset(tenants) for user, tenants in grants.items()})
