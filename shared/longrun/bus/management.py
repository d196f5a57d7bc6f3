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
AMQP_PORTS = {"amqp": 5672, "amqps": 5671}
ENABLE_HINT = ("enable RabbitMQ's management plugin (rabbitmq-plugins enable rabbitmq_management), let the "
               "scheduler reach its port, or point LONGRUN_RABBITMQ_MANAGEMENT_URL at the API")


class PolicyNotApplied(InfrastructureUnreachable):
    """The bound could not be set, or another policy displaces it: says what is missing."""


def management_urls(configured: str, amqp_url: str) -> list[str]:
    """One URL per node: ``configured`` (LONGRUN_RABBITMQ_MANAGEMENT_URL, several nodes as
    ``http://user:pass@host1:15672,host2:15672/``), else every node of ``amqp_url`` on the management
    port, with the AMQP user and password. An AMQP port other than the standard one says nothing
    about where the API listens: then the URL must be configured."""
    if configured:
        return [url.rstrip("/") for url in _nodes(configured, ("http", "https"))]
    urls = []
    for node in node_urls(amqp_url):
        parts = urlsplit(node)
        if parts.port not in (None, AMQP_PORTS[parts.scheme]):
            raise PolicyNotApplied(
                f"LONGRUN_RABBITMQ_MANAGEMENT_URL is not set and LONGRUN_AMQP_URL names port {parts.port}, so "
                f"where RabbitMQ's management API listens is unknown: set LONGRUN_RABBITMQ_MANAGEMENT_URL "
                f"(the scheduler sets the ingress queue's bound through that API)")
        scheme, port = ("https", 15671) if parts.scheme == "amqps" else ("http", MANAGEMENT_PORT)
        credentials, at, host = parts.netloc.rpartition("@")
        host = host.rsplit(":", 1)[0] if parts.port is not None else host
        urls.append(urlunsplit((scheme, f"{credentials}{at}{host}:{port}", "", "", "")))
    return urls


def _nodes(url: str, schemes: tuple[str, ...]) -> list[str]:
    scheme, _, rest = url.partition("://")
    if scheme not in schemes:
        raise ValueError(f"expected a {' or '.join(schemes)} URL")
    authority, slash, tail = rest.partition("/")
    credentials, at, hosts = authority.rpartition("@")
    return [f"{scheme}://{credentials}{at}{host.strip()}{slash}{tail}" for host in hosts.split(",")]


def vhost_of(amqp_url: str) -> str:
    """The virtual host an AMQP URL names ("/" when it names none)."""
    return unquote(urlsplit(amqp_url).path[1:]) or "/"


async def apply_policy(urls: list[str], vhost: str, policy: PolicySpec, *, queue: str, patience: float) -> None:
    """Create or replace ``policy`` in ``vhost`` through the first node of ``urls`` that answers, and
    check that no other policy there displaces it on ``queue``. Waits up to ``patience`` seconds for
    an API that does not answer yet (a broker still booting its plugins); a refusal is final at once."""
    try:
        async for attempt in AsyncRetrying(retry=retry_if_exception_type(httpx.TransportError),
                                           stop=stop_after_delay(patience),
                                           wait=wait_exponential_jitter(multiplier=0.5, max=5), reraise=True):
            with attempt:
                policies = await _set_on_a_node(urls, vhost, policy)
    except httpx.TransportError as e:
        raise PolicyNotApplied(
            f"the queue {queue!r} stays unbounded: RabbitMQ's management API does not answer at "
            f"{', '.join(map(_shown, urls))} ({e.__class__.__name__}: {e}). The scheduler sets the bound as a "
            f"policy through that API: {ENABLE_HINT}") from e
    rivals = displacing(policy, queue, policies)
    if rivals:
        raise PolicyNotApplied(
            f"the queue {queue!r} in vhost {vhost!r} would be governed by policy {rivals[0]!r}, not "
            f"{policy.name!r}: RabbitMQ applies one policy per queue, the matching one of highest priority, so "
            f"its bound would not hold. Give {', '.join(map(repr, rivals))} a priority below {policy.priority} "
            f"or a pattern that does not match {queue!r}")
    logger.info("policy %s on %s: %s", policy.name, queue, policy.definition)


async def _set_on_a_node(urls: list[str], vhost: str, policy: PolicySpec) -> list[dict[str, Any]]:
    """Set ``policy`` through the first node that answers; the vhost's policies after. Raises the last
    node's TransportError when none answers."""
    error: httpx.TransportError | None = None
    for url in urls:
        parts = urlsplit(url)
        base = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path.rstrip("/"), "", ""))
        user = unquote(parts.username or "")
        vhost_part = quote(vhost, safe="")
        async with httpx.AsyncClient(base_url=base, auth=(user, unquote(parts.password or "")), timeout=10) as http:
            try:
                answer = await http.put(f"/api/policies/{vhost_part}/{quote(policy.name, safe='')}", json={
                    "pattern": policy.pattern, "definition": policy.definition,
                    "priority": policy.priority, "apply-to": policy.apply_to})
                _check(answer, url, user, f"setting policy {policy.name!r}")
                listing = await http.get(f"/api/policies/{vhost_part}")
            except httpx.TransportError as e:
                error = e
                continue
        _check(listing, url, user, f"listing the policies of vhost {vhost!r}")
        return listing.json()  # type: ignore[no-any-return]
    assert error is not None
    raise error


def _shown(url: str) -> str:
    """The URL without its credentials."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def displacing(policy: PolicySpec, queue: str, policies: list[dict[str, Any]]) -> list[str]:
    """The names of other policies in ``policies`` (the API's listing) that match ``queue`` with a
    priority as high as ``policy``'s or higher: one of them, not ``policy``, would govern it."""
    return [p["name"] for p in policies
            if p["name"] != policy.name and p.get("apply-to", "all") in ("all", "queues")
            and p.get("priority", 0) >= policy.priority and re.search(p["pattern"], queue)]


def _check(answer: httpx.Response, url: str, user: str, doing: str) -> None:
    where = _shown(url)
    if answer.is_success:
        return
    reason = answer.text[:200]
    if answer.status_code in (401, 403):
        raise PolicyNotApplied(
            f"{doing}: RabbitMQ's management API at {where} refused user {user!r} ({answer.status_code} "
            f"{reason}): check its password; the user of LONGRUN_RABBITMQ_MANAGEMENT_URL (else of "
            f"LONGRUN_AMQP_URL) needs the tag `policymaker` or `administrator` and access to the vhost")
    raise PolicyNotApplied(f"{doing}: RabbitMQ's management API at {where} answered {answer.status_code} {reason}")
