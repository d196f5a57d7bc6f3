"""Setting a policy through RabbitMQ's management HTTP API: the one broker setting AMQP cannot make.

The scheduler sets the ingress queue's bound (``topology.ingress_policy``) here at every start, so a
changed ``LONGRUN_INGRESS_MAX_*`` takes effect with the next rollout and a broker whose queue was
declared without a bound gets one. Without access to the API the scheduler does not start: an
unbounded ingress grows until the broker's memory alarm blocks every publisher on the node.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential_jitter

from longrun.bus.connection import node_urls
from longrun.bus.topology import PolicySpec
from longrun.errors import InfrastructureUnreachable

logger = logging.getLogger(__name__)

MANAGEMENT_PORT = 15672
ENABLE_HINT = ("enable RabbitMQ's management plugin (rabbitmq-plugins enable rabbitmq_management), let the "
               "scheduler reach its port, or point LONGRUN_RABBITMQ_MANAGEMENT_URL at the API")


class PolicyNotApplied(InfrastructureUnreachable):
    """The bound could not be set, or another policy displaces it: says what is missing."""


def management_url(configured: str, amqp_url: str) -> str:
    """``configured`` (LONGRUN_RABBITMQ_MANAGEMENT_URL), else the first node of ``amqp_url`` on the
    management port over http, with the AMQP user and password."""
    if configured:
        return configured.rstrip("/")
    parts = urlsplit(node_urls(amqp_url)[0])
    credentials = parts.netloc.rpartition("@")[0]
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname
    return urlunsplit(("http", f"{credentials}@{host}:{MANAGEMENT_PORT}" if credentials else
                       f"{host}:{MANAGEMENT_PORT}", "", "", ""))


def vhost_of(amqp_url: str) -> str:
    """The virtual host an AMQP URL names ("/" when it names none)."""
    return unquote(urlsplit(amqp_url).path[1:]) or "/"


async def apply_policy(url: str, vhost: str, policy: PolicySpec, *, queue: str, patience: float) -> None:
    """Create or replace ``policy`` in ``vhost`` and check that no other policy there displaces it on
    ``queue``. Waits up to ``patience`` seconds for an API that does not answer yet (a broker
    still booting its plugins); a refusal is final at once."""
    parts = urlsplit(url)
    where = f"{parts.scheme}://{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
    auth = (unquote(parts.username or ""), unquote(parts.password or ""))
    base = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path.rstrip("/"), "", ""))
    vhost_part = quote(vhost, safe="")
    async with httpx.AsyncClient(base_url=base, auth=auth, timeout=10) as http:
        try:
            async for attempt in AsyncRetrying(retry=retry_if_exception_type(httpx.TransportError),
                                               stop=stop_after_delay(patience),
                                               wait=wait_exponential_jitter(multiplier=0.5, max=5), reraise=True):
                with attempt:
                    answer = await http.put(f"/api/policies/{vhost_part}/{quote(policy.name, safe='')}", json={
                        "pattern": policy.pattern, "definition": policy.definition,
                        "priority": policy.priority, "apply-to": policy.apply_to})
            _check(answer, where, auth[0], f"setting policy {policy.name!r}")
            listing = await http.get(f"/api/policies/{vhost_part}")
        except httpx.TransportError as e:
            raise PolicyNotApplied(
                f"the queue {queue!r} stays unbounded: RabbitMQ's management API at {where} does not answer "
                f"({e.__class__.__name__}: {e}). The scheduler sets the bound as a policy through that API: "
                f"{ENABLE_HINT}") from e
    _check(listing, where, auth[0], f"listing the policies of vhost {vhost!r}")
    rivals = displacing(policy, queue, listing.json())
    if rivals:
        raise PolicyNotApplied(
            f"the queue {queue!r} in vhost {vhost!r} would be governed by policy {rivals[0]!r}, not "
            f"{policy.name!r}: RabbitMQ applies one policy per queue, the matching one of highest priority, so "
            f"its bound would not hold. Give {', '.join(map(repr, rivals))} a priority below {policy.priority} "
            f"or a pattern that does not match {queue!r}")
    logger.info("policy %s on %s: %s", policy.name, queue, policy.definition)


def displacing(policy: PolicySpec, queue: str, policies: list[dict[str, Any]]) -> list[str]:
    """The names of other policies in ``policies`` (the API's listing) that match ``queue`` with a
    priority as high as ``policy``'s or higher: one of them, not ``policy``, would govern it."""
    return [p["name"] for p in policies
            if p["name"] != policy.name and p.get("apply-to", "all") in ("all", "queues")
            and p.get("priority", 0) >= policy.priority and re.search(p["pattern"], queue)]


def _check(answer: httpx.Response, where: str, user: str, doing: str) -> None:
    if answer.is_success:
        return
    reason = answer.text[:200]
    if answer.status_code in (401, 403):
        raise PolicyNotApplied(
            f"{doing}: RabbitMQ's management API at {where} refused user {user!r} ({answer.status_code} "
            f"{reason}): the user of LONGRUN_RABBITMQ_MANAGEMENT_URL (else of LONGRUN_AMQP_URL) needs the "
            f"tag `policymaker` or `administrator` and access to the vhost")
    raise PolicyNotApplied(f"{doing}: RabbitMQ's management API at {where} answered {answer.status_code} {reason}")
