"""A producer's answers over the real ensemble: every run.create is announced (run.accepted) or
refused (run.rejected with a code), on its tenant's routing keys, with its correlation id; the
run's status events carry that correlation id, their cause and the run's labels, and the terminal
one its outcome. The test reads what a consumer bound to ``<tenant>.run.#`` receives."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import aio_pika
import httpx
import pytest
from sqlalchemy import text

from longrun.bus import topology
from longrun.bus.codec import broker_user
from tests.fixtures import eventually
from tests.integration.ensemble import OPERATOR_TOKEN, Ensemble, new_key, run_id_for

pytestmark = pytest.mark.integration
TENANT = "acme"


@pytest.fixture
def ensemble(services, tmp_path) -> Ensemble:  # type: ignore[no-untyped-def]
    return Ensemble(services, tmp_path)


class Follower:
    """A consumer of one tenant's run events, as a downstream service binds them."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []

    async def start(self, bus, tenant: str) -> None:  # type: ignore[no-untyped-def]
        channel = await bus.channel(prefetch=100)
        exchange = await channel.get_exchange(topology.EVENTS_EXCHANGE, ensure=False)
        queue = await channel.declare_queue(exclusive=True)
        await queue.bind(exchange, f"{tenant}.run.#")
        await queue.consume(self._take, no_ack=True)

    async def _take(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.received.append((message.routing_key or "", json.loads(message.body)))

    def of(self, correlation_id: str) -> list[tuple[str, dict[str, Any]]]:
        return [(key, body) for key, body in self.received if body.get("correlation_id") == correlation_id]


def _now(check: Any) -> Any:
    """``check`` as the coroutine ``eventually`` polls."""
    async def polled() -> Any:
        return check()
    return polled


def _create(key: str, *, tenant: str = TENANT, **payload: Any) -> dict[str, Any]:
    return {"event_id": str(uuid.uuid4()), "type": "run.create", "schema_version": 2, "producer": "tests",
            "tenant_id": tenant, "correlation_id": f"corr-{key}", "occurred_at": datetime.now(UTC).isoformat(),
            "payload": {"workflow": "steps", "idempotency_key": key, "input": {"steps": 2}, **payload}}


async def _publish(bus, body: dict[str, Any] | bytes) -> None:  # type: ignore[no-untyped-def]
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    await bus.publish(topology.INGRESS_EXCHANGE, "run.create",
                      aio_pika.Message(raw, content_type="application/json", user_id=broker_user(bus.url),
                                       delivery_mode=aio_pika.DeliveryMode.PERSISTENT))


def _start(ensemble: Ensemble, **scheduler_env: str) -> None:
    ensemble.start("scheduler", "longrun.services.scheduler", **scheduler_env)
    ensemble.start("worker", "longrun.services.worker")
    ensemble.start("relay", "longrun.services.outbox_relay")


async def test_each_refused_create_is_answered_with_its_code_and_the_next_one_completes(
        clean, engine, bus, ensemble) -> None:
    # Given the ensemble taking inputs of at most 1 KiB, and a consumer of acme's run events
    _start(ensemble, LONGRUN_MAX_INPUT_BYTES="1024")
    follower = Follower()
    await follower.start(bus, TENANT)
    invalid = _create("invalid")
    del invalid["payload"]["workflow"]
    future = {**_create("future"), "schema_version": 9}
    refused = {
        "invalid": (invalid, "invalid_payload"),
        "future": (future, "unknown_schema_version"),
        "unknown": (_create("unknown", workflow="no_such_kind"), "unknown_workflow"),
        "pinned": (_create("pinned", workflow_version="99"), "unknown_workflow_version"),
        "large": (_create("large", input={"blob": "x" * 2048}), "input_too_large"),
        "shapeless": (_create("shapeless", input={"steps": "abc"}), "input_invalid"),
    }
    # When a producer sends each bad create, a body with no envelope, then a good create, on one queue
    for body, _ in refused.values():
        await _publish(bus, body)
    await _publish(bus, b"this is not an envelope")
    good = _create("good")
    await _publish(bus, good)
    # Then each bad one is answered on acme.run.rejected with its code, reason and correlation id
    for key, (body, code) in refused.items():
        answers = await eventually(_now(lambda key=key: follower.of(f"corr-{key}") or None),
                                   what=f"the answer to {key}")
        [(routing_key, answer)] = answers
        assert routing_key == "acme.run.rejected", key
        assert (answer["type"], answer["schema_version"]) == ("run.rejected", 3), key
        assert answer["payload"]["code"] == code and answer["payload"]["reason"], key
        assert answer["payload"]["refused_event_id"] == answer["causation_id"] == body["event_id"], key
    assert "steps: Input should be a valid integer" in follower.of("corr-shapeless")[0][1]["payload"]["reason"]
    # and the ones that did not parse are kept in quarantine with their reason, the bodyless one too
    async with engine.connect() as conn:
        kept = {bytes(r.body): r.error_code for r in await conn.execute(text(
            "SELECT body, error_code FROM quarantine WHERE owner = 'scheduler'"))}
    assert sorted(kept.values()) == ["decode_error", "decode_error", "unknown_schema_version"]
    assert b"this is not an envelope" in kept
    # and none of them made a run
    async with engine.connect() as conn:
        made = (await conn.execute(text("SELECT count(*) FROM runs WHERE idempotency_key = ANY(:keys)"),
                                   {"keys": list(refused)})).scalar_one()
    assert made == 0
    # and the good create after them was accepted and completed, its outcome on its terminal event
    run_id = await eventually(lambda: run_id_for(engine, TENANT, "good"), what="the good run")
    events = await eventually(_now(lambda: _terminal(follower.of("corr-good"))), timeout=30, what="its terminal event")
    assert events[0][0] == "acme.run.accepted" and events[0][1]["payload"]["run_id"] == run_id
    statuses = [body["payload"]["status"] for _, body in events[1:]]
    assert statuses[-1] == "COMPLETED"
    seqs = [body["payload"]["seq"] for _, body in events[1:]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    outcome = events[-1][1]["payload"]["outcome"]
    assert outcome["status"] == "COMPLETED" and outcome["acceptance"]["unmet"] == []
    assert [(r["logical_action"], r["tool"], r["fields"]) for r in outcome["receipts"]] == [
        ("step:0", "bench.echo", {"step": 0}), ("step:1", "bench.echo", {"step": 1})]


def _announcements(follower: Follower, key: str, count: int) -> list[dict[str, Any]] | None:
    found = [body for routing_key, body in follower.of(f"corr-{key}") if routing_key == "acme.run.accepted"]
    return found if len(found) == count else None


def _terminal(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]] | None:
    ended = any(body["type"] == "run.event" and body["payload"]["outcome"] is not None for _, body in events)
    return events if ended else None


async def test_a_repeated_create_is_announced_again_and_labels_are_kept_and_searchable(
        clean, engine, bus, ensemble) -> None:
    # Given the ensemble with its gateway, and a consumer of acme's run events
    _start(ensemble)
    ensemble.start("gateway", "longrun.services.gateway")
    follower = Follower()
    await follower.start(bus, TENANT)
    key = new_key()
    labels = {"team": "payments", "ticket": "PAY-42"}
    # When a producer sends one create twice (two messages, one idempotency key), with labels
    first, second = _create(key, labels=labels), _create(key, labels=labels)
    await _publish(bus, first)
    await _publish(bus, second)
    # Then both are answered with run.accepted for the same run: new event ids, the second a repeat
    accepted = await eventually(_now(lambda: _announcements(follower, key, 2)), what="two announcements")
    run_id = await run_id_for(engine, TENANT, key)
    assert [a["payload"]["run_id"] for a in accepted] == [run_id, run_id]
    assert [a["causation_id"] for a in accepted] == [first["event_id"], second["event_id"]]
    assert [a["payload"]["repeated"] for a in accepted] == [False, True]
    assert accepted[0]["event_id"] != accepted[1]["event_id"]
    assert accepted[0]["payload"]["labels"] == labels and accepted[0]["payload"]["versions"]["workflow"]
    # and every status event carries the labels, the correlation id and the wakeup that caused it
    events = await eventually(_now(lambda: _terminal(follower.of(f"corr-{key}"))), timeout=30, what="the run's end")
    statuses = [b for _, b in events if b["type"] == "run.event"]
    assert all(b["payload"]["labels"] == labels and b["run_id"] == run_id for b in statuses)
    assert all(b["causation_id"] for b in statuses)
    # and operators find the run by label and by idempotency key
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url,
                                 headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}) as gateway:
        by_label = (await gateway.get("/runs", params=[("label", "team=payments"), ("label", "ticket=PAY-42")])
                    ).json()["runs"]
        by_key = (await gateway.get("/runs", params={"tenant_id": TENANT, "idempotency_key": key})).json()["runs"]
        other = (await gateway.get("/runs", params={"label": "team=search"})).json()["runs"]
        bad = await gateway.get("/runs", params={"label": "team"})
    assert [r["run_id"] for r in by_label] == [r["run_id"] for r in by_key] == [run_id]
    assert by_label[0]["labels"] == labels and other == [] and bad.status_code == 400


async def test_a_tenants_consumer_sees_none_of_another_tenants_events(clean, engine, bus, ensemble) -> None:
    # Given consumers of two tenants
    _start(ensemble)
    acme, globex = Follower(), Follower()
    await acme.start(bus, "acme")
    await globex.start(bus, "globex")
    # When each tenant creates a run
    await _publish(bus, _create("mine", tenant="acme"))
    await _publish(bus, _create("theirs", tenant="globex"))
    await eventually(_now(lambda: _terminal(acme.of("corr-mine"))), timeout=30, what="acme's run ended")
    await eventually(_now(lambda: _terminal(globex.of("corr-theirs"))), timeout=30, what="globex's run ended")
    await asyncio.sleep(0.2)
    # Then each saw only its own
    assert {b["tenant_id"] for _, b in acme.received} == {"acme"}
    assert {b["tenant_id"] for _, b in globex.received} == {"globex"}
    assert all(k.startswith("acme.run.") for k, _ in acme.received)


async def test_a_run_an_operator_terminates_ends_with_the_public_receipts_of_what_it_did(
        clean, engine, bus, ensemble) -> None:
    # Given a long run that has confirmed some of its steps, and a consumer of acme's run events
    _start(ensemble)
    ensemble.start("gateway", "longrun.services.gateway")
    follower = Follower()
    await follower.start(bus, TENANT)
    await _publish(bus, _create("long", input={"steps": 100_000}))
    run_id = await eventually(lambda: run_id_for(engine, TENANT, "long"), what="the run")
    await eventually(lambda: _confirmed(engine, run_id, 3), what="three steps done")
    # When an operator terminates it
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url,
                                 headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}) as gateway:
        answer = await gateway.post(f"/runs/{run_id}/terminate", json={"reason": "enough"})
    assert answer.status_code == 200, answer.text
    # Then its terminal event lists every step that took effect, each with its tool's public field
    events = await eventually(_now(lambda: _terminal(follower.of("corr-long"))), what="the terminal event")
    outcome = events[-1][1]["payload"]["outcome"]
    assert outcome["status"] == "TERMINATED" and events[-1][1]["causation_id"] == "operator:bootstrap"
    done = await _confirmed(engine, run_id, 0)
    assert [(r["logical_action"], r["fields"]) for r in outcome["receipts"]] == [
        (f"step:{i}", {"step": i}) for i in range(done)]


async def _confirmed(engine, run_id: str, at_least: int) -> int:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        count = (await conn.execute(text("SELECT count(*) FROM actions WHERE run_id = :r AND status = 'CONFIRMED'"),
                                    {"r": run_id})).scalar_one()
    return count if count >= at_least else 0
