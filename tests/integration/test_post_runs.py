"""Producers without AMQP: ``POST /runs`` on the real gateway, scheduler, worker and relay. A create over
HTTP is admitted as one on the bus is (one run per key, run.accepted through the outbox, refusals with
their run.rejected codes) and its run completes as a bus-created one does."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, event_types, new_key, run_id_for, status_of
from tests.integration.identities import bearer
from tests.integration.test_run_answers import Follower, _announcements, _create, _now, _publish

pytestmark = pytest.mark.integration
TENANT = "acme"


def create_body(key: str, *, tenant: str = TENANT, schema_version: int = 4, **payload: Any) -> dict[str, Any]:
    return {"tenant_id": tenant, "schema_version": schema_version, "correlation_id": f"corr-{key}",
            "payload": {"workflow": "steps", "idempotency_key": key, "input": {"steps": 2}, **payload}}


async def post(url: str, headers: dict[str, str], body: dict[str, Any], key: str | None) -> httpx.Response:
    sent = {**headers, **({"idempotency-key": key} if key is not None else {})}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        return await http.post("/runs", json=body, headers=sent)


@pytest.fixture
async def producer(clean, engine) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """A producer of acme: the create_runs permission and no role."""
    return await bearer(engine, "acme-producer", tenants=(TENANT,), permissions=("create_runs",))


async def _started(ensemble: Ensemble, *names: str, **env: str) -> str:
    ensemble.start_services(*names, **env)
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    return ensemble.gateway_url


@pytest.mark.timeout(240)
async def test_a_post_creates_one_run_per_key_announced_on_the_bus_and_it_completes_like_a_bus_create(
        clean, engine, bus, services, tmp_path, producer) -> None:  # type: ignore[no-untyped-def]
    # Given the whole ensemble and a consumer of acme's run events
    url = await _started(Ensemble(services, tmp_path), "gateway", "scheduler", "worker", "relay")
    follower = Follower()
    await follower.start(bus, TENANT)
    key = new_key()
    # When a producer POSTs a create, then the same create again (a retry)
    first = await post(url, producer, create_body(key, labels={"order": "o-1"}), key)
    again = await post(url, producer, create_body(key, labels={"order": "o-1"}), key)
    # Then the first made the run (201) and the retry answers that run as a repeat (200)
    assert first.status_code == 201, first.text
    assert again.status_code == 200, again.text
    made = first.json()
    assert (made["workflow"], made["repeated"], made["labels"], made["idempotency_key"]) == (
        "steps", False, {"order": "o-1"}, key)
    assert (again.json()["run_id"], again.json()["repeated"]) == (made["run_id"], True)
    # and the runs table holds one run for the key
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT run_id FROM runs WHERE tenant_id = :t AND idempotency_key = :k"),
                                   {"t": TENANT, "k": key})).scalars().all()
    assert rows == [made["run_id"]]
    # and the bus announced the run once as made and once as repeated, as it answers a repeated bus create
    # (the run's own events share the correlation id and may be heard between the two)
    accepted = await eventually(_now(lambda: _announcements(follower, key, 2)), what="both run.accepted")
    assert sorted((b["payload"]["run_id"], b["payload"]["repeated"]) for b in accepted) == [
        (made["run_id"], False), (made["run_id"], True)]
    assert {b["producer"] for b in accepted} == {"scheduler"}
    # and the run completes, through the same events as a run created on the bus
    bus_key = new_key()
    await _publish(bus, _create(bus_key))
    bus_run = await eventually(lambda: run_id_for(engine, TENANT, bus_key), what="the bus-created run")
    for run_id in (made["run_id"], bus_run):
        await eventually(_now_status(engine, run_id, "COMPLETED"), timeout=120, what=f"{run_id} completed")
    assert [t for t, _ in await event_types(engine, made["run_id"])] == [
        t for t, _ in await event_types(engine, bus_run)]


def _now_status(engine, run_id: str, status: str):  # type: ignore[no-untyped-def]
    async def reached() -> bool:
        return await status_of(engine, run_id) == status
    return reached


async def test_each_refusal_answers_its_status_and_its_run_rejected_code(
        clean, engine, services, tmp_path, producer) -> None:  # type: ignore[no-untyped-def]
    # Given a gateway taking inputs of at most 1 KiB, and a run made under the key "taken"
    url = await _started(Ensemble(services, tmp_path), "gateway", LONGRUN_MAX_INPUT_BYTES="1024")
    assert (await post(url, producer, create_body("taken"), "taken")).status_code == 201
    invalid = create_body("invalid")
    del invalid["payload"]["workflow"]
    refused = {
        "taken": (create_body("taken", input={"steps": 3}), 409, "idempotency_key_reused"),
        "invalid": (invalid, 422, "invalid_payload"),
        "future": (create_body("future", schema_version=9), 422, "unknown_schema_version"),
        "unknown": (create_body("unknown", workflow="no_such_kind"), 422, "unknown_workflow"),
        "pinned": (create_body("pinned", workflow_version="99"), 422, "unknown_workflow_version"),
        "large": (create_body("large", input={"blob": "x" * 2048}), 413, "input_too_large"),
        "shapeless": (create_body("shapeless", input={"steps": "abc"}), 422, "input_invalid"),
        "elsewhere": (create_body("elsewhere", tenant="globex"), 403, "tenant_not_allowed"),
    }
    # When the producer POSTs each bad create
    for key, (body, status, code) in refused.items():
        answer = await post(url, producer, body, key)
        # Then each is refused with its code's status and the code
        assert (answer.status_code, answer.json()["code"]) == (status, code), (key, answer.text)
        assert answer.json()["error"], key
    # and a refusal admission made is the run.rejected it published, naming the run that holds the key
    reused = (await post(url, producer, refused["taken"][0], "taken")).json()
    assert reused["rejected"]["existing_run_id"] == await run_id_for(engine, TENANT, "taken")
    # and the refusal in another tenant is audited
    async with engine.connect() as conn:
        audited = (await conn.execute(text(
            "SELECT actor, target FROM audit_log WHERE action = 'run.create.refused'"))).all()
    assert [tuple(r) for r in audited] == [("acme-producer", "globex")]
    # and none of them made a run
    async with engine.connect() as conn:
        made = (await conn.execute(text("SELECT count(*) FROM runs"))).scalar_one()
    assert made == 1


async def test_an_older_payload_version_is_upcast_as_on_the_bus(
        clean, engine, services, tmp_path, producer) -> None:  # type: ignore[no-untyped-def]
    url = await _started(Ensemble(services, tmp_path), "gateway")
    # Given a version-1 create (a single cost ceiling), When it is POSTed
    body = {"tenant_id": TENANT, "schema_version": 1,
            "payload": {"workflow": "steps", "idempotency_key": "v1", "input": {"steps": 1}, "budget_usd": 2.5}}
    answer = await post(url, producer, body, "v1")
    # Then it makes a run, its budget read as the upcaster reads it
    assert answer.status_code == 201, answer.text
    async with engine.connect() as conn:
        budget = (await conn.execute(text("SELECT budget::text FROM runs WHERE run_id = :r"),
                                     {"r": answer.json()["run_id"]})).scalar_one()
    assert "2.5" in budget


async def test_the_idempotency_key_header_is_required_and_must_equal_the_payloads(
        clean, engine, services, tmp_path, producer) -> None:  # type: ignore[no-untyped-def]
    url = await _started(Ensemble(services, tmp_path), "gateway")
    # When the header is missing, or names another key than the payload
    missing = await post(url, producer, create_body("k-1"), None)
    other = await post(url, producer, create_body("k-1"), "k-2")
    # Then both are refused as bad requests, and nothing is made
    assert (missing.status_code, other.status_code) == (400, 400), (missing.text, other.text)
    assert "Idempotency-Key" in missing.json()["error"] and "Idempotency-Key" in other.json()["error"]
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM runs"))).scalar_one() == 0


async def test_numbers_and_nesting_storage_cannot_keep_are_refused_not_a_server_error(
        clean, engine, services, tmp_path, producer) -> None:  # type: ignore[no-untyped-def]
    url = await _started(Ensemble(services, tmp_path), "gateway")
    # When creates carry an integer past 64 bits in their input or budget, a number past a float's range,
    # or an input nested deeper than storage takes
    deep: dict[str, Any] = {}
    for _ in range(60):
        deep = {"d": [deep]}
    hostile = {"huge-input": json.dumps(create_body("huge-input", input={"steps": 2**70})),
               "huge-budget": json.dumps(create_body("huge-budget", budget={"model_calls": 2**70})),
               "overflow": json.dumps(create_body("overflow", input={"x": "OVERFLOW"})).replace('"OVERFLOW"', "1e400"),
               "deep": json.dumps(create_body("deep", input=deep))}
    for key, raw in hostile.items():
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            answer = await http.post("/runs", content=raw, headers={**producer, "idempotency-key": key,
                                                                     "content-type": "application/json"})
        # Then each is refused naming why: the numbers as an invalid payload, the nesting as deeper than any
        # body the API takes; and nothing is made
        expected = (400, None) if key == "deep" else (422, "invalid_payload")
        assert (answer.status_code, answer.json().get("code")) == expected, (key, answer.text)
        assert answer.json()["error"], key
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM runs"))).scalar_one() == 0
