"""Hostile input at volume: generated messages on the ingress and the worker's partition queues, and
webhook deliveries at the gateway, against a running ensemble.

The short form (``make test``) sends ``SHORT_MESSAGES``; ``make fuzz`` the long form
(``FUZZ_MESSAGES``, default 5000). Both print the seed first (replay with ``FUZZ_SEED=<seed>``:
the same specimens in the same order), then every message must be accounted for by what the
system recorded of it:
- a bus message is refused by the broker (unroutable), quarantined (a ``quarantine`` row carries
  its ``x-fuzz-id`` header), or handled: its event id has its consumer's inbox row (a created or
  refused run.create, a wakeup not taken) and every later copy of that id was absorbed;
- a webhook is answered 202 (its event is in the gateway's inbox), 401 (a ``webhook.refused``
  audit row), or 400/404 with the reason; never 5xx, never a dropped connection.
Meanwhile no service dies, each stays ready, the queues drain; afterwards a normal run completes.
Figures (messages, outcomes by kind, crashes) are printed and kept in var/fuzz/.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import pytest
from aio_pika.exceptions import DeliveryError, PublishError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.bus import topology
from longrun.bus.codec import broker_user
from longrun.bus.connection import Bus
from longrun.envelope import decode
from longrun.errors import PoisonMessage
from tests.chaos.chaos import patiently
from tests.fixtures import PARTITIONS, eventually
from tests.fuzz.hostile import BusSpecimen, Specimen, WebhookSpecimen, draw
from tests.harness import Process
from tests.integration.ensemble import ROOT, WEBHOOK_SECRET, Ensemble, new_key, publish_create, run_id_for, \
    status_of
from tests.ports import free_port

SHORT_MESSAGES = 500
LONG = bool(os.environ.get("FUZZ_MESSAGES", "").strip())
MESSAGES = int(os.environ.get("FUZZ_MESSAGES", "").strip() or SHORT_MESSAGES)
SEED = int(os.environ.get("FUZZ_SEED", "").strip() or random.SystemRandom().randrange(1, 2**31))
SETTLE_SECONDS = 60.0 + MESSAGES / 20
"""How long every message gets to reach its outcome after the last one was sent: a consumer still
busy after it has stalled."""
WEBHOOKS_IN_FLIGHT = 8
FUZZ_ID = "x-fuzz-id"
SERVICES = (("gateway", "longrun.services.gateway"), ("scheduler", "longrun.services.scheduler"), ("worker-a", "longrun.services.worker"),
            ("worker-b", "longrun.services.worker"), ("relay", "longrun.services.outbox_relay"), ("timer", "longrun.services.timer"),
            ("reconciler", "longrun.services.reconciler"))
CONSUMER_OF = {"ingress": "scheduler", "worker": "worker"}

pytestmark = [pytest.mark.integration]


def _say(line: str) -> None:
    print(f"[fuzz] {line}", flush=True)


@dataclass
class Sent:
    """What happened at the sending end."""

    bus: dict[int, BusSpecimen] = field(default_factory=dict)
    unroutable: set[int] = field(default_factory=set)
    answers: dict[int, tuple[WebhookSpecimen, int, str]] = field(default_factory=dict)
    """Webhook index -> (specimen, HTTP status, body)."""
    dropped: dict[int, str] = field(default_factory=dict)
    """Webhook index -> the transport error in place of an answer."""


@pytest.mark.timeout(SETTLE_SECONDS + MESSAGES / 5 + 120)
async def test_hostile_input_is_accepted_refused_or_quarantined(clean, engine, bus, services, tmp_path: Path) -> None:
    replay = f"replay with FUZZ_SEED={SEED} FUZZ_MESSAGES={MESSAGES}"
    _say(f"FUZZ_SEED={SEED} ({'long' if LONG else 'short'} form: {MESSAGES} messages)")
    began = time.monotonic()
    # In a thread: drawing takes seconds, and the bus connection's heartbeats must go on meanwhile.
    specimens = await asyncio.to_thread(draw, SEED, MESSAGES, secret=WEBHOOK_SECRET)
    _say(f"{len(specimens)} specimens drawn in {time.monotonic() - began:.1f}s")
    ensemble = Ensemble(services, tmp_path)
    health = {name: free_port() for name, _ in SERVICES}
    procs = {name: ensemble.start(name, module, LONGRUN_HEALTH_PORT=str(health[name])) for name, module in SERVICES}
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    for name in procs:
        await ensemble.wait_http(f"http://127.0.0.1:{health[name]}/readyz")

    sent = Sent()
    sending = time.monotonic()
    await asyncio.gather(_publish(bus, specimens, sent), _post(ensemble.gateway_url, specimens, sent))
    send_seconds = time.monotonic() - sending
    _say(f"sent in {send_seconds:.1f}s; waiting for every message's outcome")

    tally = await _settle(engine, bus, sent, procs, time.monotonic() + SETTLE_SECONDS)
    not_ready = await _not_ready(health)
    dead = {name: p.popen.returncode for name, p in procs.items() if not p.alive()}
    normal = await _normal_run(engine, bus) if not dead else "not tried: a service died"
    figures = _figures(specimens, sent, tally, dead, not_ready, normal, send_seconds, time.monotonic() - began,
                       services.logs)
    figures["runs_by_status"] = await patiently(lambda: _runs_by_status(engine))
    for line in json.dumps(figures, indent=2, sort_keys=True, ensure_ascii=False).splitlines():
        _say(line)
    _keep(figures)

    assert not dead, f"services died: {dead} ({replay})"
    assert not sent.dropped, f"the gateway dropped {len(sent.dropped)} webhook(s): {_some(sent.dropped)} ({replay})"
    server_errors = {i: (s.shape, status, body[:200]) for i, (s, status, body) in sent.answers.items() if status >= 500}
    assert not server_errors, f"the gateway answered 5xx to bad input: {_some(server_errors)} ({replay})"
    assert not tally.lost, f"{len(tally.lost)} message(s) neither handled, refused nor quarantined: " \
                           f"{_some({i: sent.bus[i].shape for i in tally.lost})} ({replay})"
    assert not tally.webhook_unrecorded, f"webhooks answered without the record their answer claims: " \
                                         f"{tally.webhook_unrecorded[:10]} ({replay})"
    assert not tally.queued, f"queues did not drain: {tally.queued} ({replay})"
    assert not not_ready, f"services not ready after the fuzz: {not_ready} ({replay})"
    assert normal == "COMPLETED", f"a normal run afterwards ended {normal} ({replay})"
    assert figures["accounted"] == figures["messages"], figures


async def _publish(bus: Bus, specimens: list[Specimen], sent: Sent) -> None:
    assert bus.connection is not None
    channel = await bus.connection.channel(publisher_confirms=True, on_return_raises=True)
    exchanges = {target: await channel.get_exchange(name, ensure=False) for target, name in (
        ("ingress", topology.INGRESS_EXCHANGE), ("worker", topology.work_exchange("worker")))}
    publisher = broker_user(bus.url)
    for i, specimen in enumerate(specimens):
        if not isinstance(specimen, BusSpecimen):
            continue
        sent.bus[i] = specimen
        message = aio_pika.Message(
            body=specimen.body, content_type=specimen.content_type, content_encoding=specimen.content_encoding,
            message_id=specimen.message_id, type=specimen.type, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            headers={**specimen.headers, FUZZ_ID: str(i)}, user_id=None if specimen.anonymous else publisher)
        try:
            await exchanges[specimen.target].publish(message, routing_key=specimen.routing_key, mandatory=True)
        except (DeliveryError, PublishError):
            sent.unroutable.add(i)
    await channel.close()


async def _post(gateway_url: str, specimens: list[Specimen], sent: Sent) -> None:
    hooks = [(i, s) for i, s in enumerate(specimens) if isinstance(s, WebhookSpecimen)]
    lanes = asyncio.Semaphore(WEBHOOKS_IN_FLIGHT)
    async with httpx.AsyncClient(base_url=gateway_url, timeout=30) as http:
        async def one(i: int, specimen: WebhookSpecimen) -> None:
            async with lanes:
                try:
                    answer = await http.post(f"/webhooks/{specimen.provider}", content=specimen.body,
                                             headers=specimen.headers)
                    sent.answers[i] = (specimen, answer.status_code, answer.text)
                except httpx.HTTPError as e:
                    sent.dropped[i] = f"{e.__class__.__name__}: {e}"

        await asyncio.gather(*(one(i, s) for i, s in hooks))


@dataclass
class Tally:
    outcomes: dict[int, str] = field(default_factory=dict)
    """Index -> outcome kind, for every message accounted for."""
    lost: list[int] = field(default_factory=list)
    webhook_unrecorded: list[str] = field(default_factory=list)
    queued: dict[str, int] = field(default_factory=dict)


async def _settle(engine: AsyncEngine, bus: Bus, sent: Sent, procs: dict[str, Process], deadline: float) -> Tally:
    """Account for every message, waiting until each has its outcome and the queues are empty (or
    ``deadline`` passed, or a service died: what is missing then is lost)."""
    while True:
        tally = await patiently(lambda: _account(engine, bus, sent))
        done = not tally.lost and not tally.queued and not tally.webhook_unrecorded
        if done or time.monotonic() > deadline or any(not p.alive() for p in procs.values()):
            return tally
        await asyncio.sleep(1.0)


async def _account(engine: AsyncEngine, bus: Bus, sent: Sent) -> Tally:
    tally = Tally()
    async with engine.connect() as conn:
        quarantined = {row.fuzz: f"quarantined: {row.owner} {row.error_code}" for row in await conn.execute(text(
            f"SELECT headers->>'{FUZZ_ID}' AS fuzz, owner, error_code FROM quarantine "
            f"WHERE headers ? '{FUZZ_ID}'"))}
        outcomes = {service: {row.message_id: row.outcome for row in await conn.execute(text(
            f"SELECT message_id, outcome FROM inbox_{service}"))} for service in ("scheduler", "worker")}
        webhooks = set((await conn.execute(text(
            "SELECT message_id FROM inbox_gateway WHERE message_id LIKE 'webhook:%'"))).scalars())
        # Refusals are audited by sample: each row stands for itself and the ones counted before it.
        refusals = (await conn.execute(text(
            "SELECT count(*) AS rows, coalesce(sum(1 + (details->>'refused_unaudited_before')::int), 0) AS counted "
            "FROM audit_log WHERE action = 'webhook.refused'"))).one()

    handled: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, specimen in sent.bus.items():
        if i in sent.unroutable:
            tally.outcomes[i] = "refused by the broker: unroutable"
        elif str(i) in quarantined:
            tally.outcomes[i] = quarantined[str(i)]
        else:
            try:
                handled[(CONSUMER_OF[specimen.target], decode(specimen.body).event_id)].append(i)
            except PoisonMessage:
                tally.lost.append(i)  # unreadable, yet not quarantined (yet)
    for (service, event_id), copies in handled.items():
        outcome = outcomes[service].get(event_id)
        if outcome is None:
            tally.lost.extend(copies)
            continue
        tally.outcomes[copies[0]] = f"handled: {service} {_kind(outcome)}"
        for later in copies[1:]:
            tally.outcomes[later] = f"handled: {service} duplicate absorbed"

    for i, (specimen, status, body) in sent.answers.items():
        tally.outcomes[i] = f"webhook {status}"
        if status == 202:
            event_id = json.loads(body)["event_id"]
            if f"webhook:{specimen.provider}:{event_id}" not in webhooks:
                tally.webhook_unrecorded.append(f"{i}: 202 for {event_id!r} without its inbox row")
    answered_401 = sum(1 for _, status, _ in sent.answers.values() if status == 401)
    if (answered_401 > 0) != (refusals.rows > 0) or refusals.counted > answered_401:
        tally.webhook_unrecorded.append(f"{answered_401} answered 401, {refusals.rows} webhook.refused audit rows "
                                        f"standing for {refusals.counted}")
    tally.queued = await _queued(bus)
    return tally


def _kind(outcome: dict[str, Any]) -> str:
    if outcome.get("rejected"):
        return f"refused ({outcome.get('code')})"
    if "created" in outcome:
        return "run created" if outcome["created"] else "same run answered"
    if "taken" in outcome:
        return "taken" if outcome["taken"] else f"not taken ({outcome.get('reason')})"
    return json.dumps(outcome, sort_keys=True)[:80]


async def _queued(bus: Bus) -> dict[str, int]:
    """Ready messages in the queues the fuzz reaches (and the dead letters' queue)."""
    assert bus.connection is not None
    names = [topology.SCHEDULER_INGRESS_QUEUE, topology.QUARANTINE_QUEUE,
             *(topology.partition_queue("worker", k) for k in range(PARTITIONS))]
    channel = await bus.connection.channel()
    try:
        counts = {name: (await channel.declare_queue(name, passive=True)).declaration_result.message_count
                  for name in names}
    finally:
        await channel.close()
    return {name: n for name, n in counts.items() if n}


async def _not_ready(health: dict[str, int]) -> dict[str, str]:
    failing = {}
    async with httpx.AsyncClient(timeout=5) as http:
        for name, port in health.items():
            try:
                answer = await http.get(f"http://127.0.0.1:{port}/readyz")
                if answer.status_code != 200:
                    failing[name] = answer.text.strip()
            except httpx.HTTPError as e:
                failing[name] = f"{e.__class__.__name__}: {e}"
    return failing


async def _normal_run(engine: AsyncEngine, bus: Bus) -> str:
    key = new_key()
    await publish_create(bus, tenant="fz-normal", key=key, input_={"steps": 2}, workflow="steps")
    try:
        run_id = await eventually(lambda: run_id_for(engine, "fz-normal", key), timeout=30, what="the normal run")
    except AssertionError:
        return "not created"

    async def ended() -> str | None:
        status = await status_of(engine, run_id)
        return status if status in ("COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT", "NEEDS_ATTENTION") else None

    try:
        return str(await eventually(ended, timeout=30, what="the normal run's end"))
    except AssertionError:
        return f"not ended: {await status_of(engine, run_id)}"


async def _runs_by_status(engine: AsyncEngine) -> dict[str, int]:
    """Where the runs the valid creates asked for stand (a run's own input may fail its steps)."""
    async with engine.connect() as conn:
        return dict((await conn.execute(text("SELECT status, count(*) FROM runs GROUP BY 1"))).all())


def _figures(specimens: list[Specimen], sent: Sent, tally: Tally, dead: dict[str, int | None],
             not_ready: dict[str, str], normal: str, send_seconds: float, total: float, logs: Path) -> dict[str, Any]:
    shapes = Counter(s.shape.split(":")[0].split(",")[0] for s in specimens)
    return {
        "seed": SEED, "form": "long" if LONG else "short",
        "messages": len(specimens), "bus_messages": len(sent.bus), "webhooks": len(sent.answers) + len(sent.dropped),
        "bytes": sum(len(s.body) for s in specimens),
        "shapes": dict(shapes),
        "outcomes": dict(Counter(tally.outcomes.values())),
        "accounted": len(tally.outcomes), "lost": len(tally.lost) + len(sent.dropped),
        "webhook_statuses": dict(Counter(str(status) for _, status, _ in sent.answers.values())),
        "crashes": len(dead), "dead": dead, "not_ready_after": not_ready, "queued_after": tally.queued,
        "error_log_lines": _error_lines(logs),
        "normal_run_after": normal,
        "seconds": {"send": round(send_seconds, 1), "total": round(total, 1)},
    }


def _error_lines(logs: Path) -> dict[str, int]:
    """ERROR records per service (quarantining a message logs one: a figure, not a failure)."""
    found: Counter[str] = Counter()
    for log in logs.glob("*.log"):
        with log.open(errors="replace") as f:
            found[log.stem] += sum(1 for line in f if '"level": "ERROR"' in line or " ERROR " in line)
    return dict(+found)


def _some(items: dict[Any, Any]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in list(items.items())[:10])


def _keep(figures: dict[str, Any]) -> None:
    out = ROOT / "var" / "fuzz"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{figures['form']}-{figures['seed']}.json").write_text(
        json.dumps(figures, indent=2, sort_keys=True, ensure_ascii=False))
