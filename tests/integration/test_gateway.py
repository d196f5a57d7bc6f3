"""The gateway over HTTP: signed webhooks deduplicated into one transition, audited operator actions."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import httpx
import pytest
from sqlalchemy import text

from longrun.app import webhooks
from longrun.app.transaction import PgTransaction
from longrun.db import runs
from longrun_dependency_upgrade.forge import sign_payload
from tests.integration.ensemble import OPERATOR_TOKEN, WEBHOOK_SECRET, Ensemble
from tests.integration.runs_factory import waiting_for_event, waiting_for_user

pytestmark = pytest.mark.integration


@pytest.fixture
async def gateway(services, tmp_path):  # type: ignore[no-untyped-def]
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "services.gateway")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        yield http


def ci_event(event_id: str, ci_run_id: int, status: str = "passed") -> bytes:
    return json.dumps({"id": event_id, "type": "ci.finished", "ci_run_id": ci_run_id, "repo": "acme/payments",
                       "sha": "abc123", "status": status, "log_excerpt": "ok"}).encode()


async def post_webhook(http: httpx.AsyncClient, body: bytes, *, secret: str = WEBHOOK_SECRET) -> httpx.Response:
    return await http.post("/webhooks/forge", content=body, headers={
        "x-forge-signature": sign_payload(secret, body), "content-type": "application/json"})


async def count(engine, sql: str) -> int:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return int((await conn.execute(text(sql))).scalar() or 0)


async def test_the_same_webhook_three_times_makes_one_transition(clean, engine, gateway) -> None:
    # Given a run waiting for CI run 7
    stored = await waiting_for_event(engine, "ci/acme/payments/7")
    body = ci_event("delivery-1", 7)
    # When the provider delivers the same event three times
    responses = [await post_webhook(gateway, body) for _ in range(3)]
    # Then each got a fast 2xx, and the run moved once
    assert [r.status_code for r in responses] == [202, 202, 202]
    assert [r.json().get("duplicate", False) for r in responses] == [False, True, True]
    async with engine.connect() as conn:
        after = await runs.load(conn, stored.snapshot.run_id)
        types = (await conn.execute(text("SELECT type FROM run_events WHERE run_id = :r ORDER BY seq"),
                                    {"r": stored.snapshot.run_id})).scalars().all()
    assert after is not None and after.snapshot.status.value == "READY"
    assert types.count("run.woken") == 1 and types.count("fact.recorded") == 1
    assert await count(engine, "SELECT count(*) FROM outbox WHERE type = 'run.wakeup'") == 1


async def test_a_bad_signature_is_refused_with_401_and_leaves_only_an_audit_line(clean, engine, gateway) -> None:
    stored = await waiting_for_event(engine, "ci/acme/payments/8")
    response = await post_webhook(gateway, ci_event("forged", 8), secret="not-the-secret")
    assert response.status_code == 401
    assert await count(engine, "SELECT count(*) FROM inbox_gateway") == 0
    assert await count(engine, "SELECT count(*) FROM webhook_events") == 0
    assert await count(engine, "SELECT count(*) FROM outbox") == 0
    async with engine.connect() as conn:
        assert await runs.load(conn, stored.snapshot.run_id) == stored
        audit = (await conn.execute(text("SELECT actor, action, reason FROM audit_log"))).all()
    assert [tuple(a) for a in audit] == [("webhook:forge", "webhook.refused", "bad or missing signature")]


async def test_a_timestamped_delivery_sent_again_outside_the_replay_window_is_refused_and_audited(
        clean, engine, services, tmp_path) -> None:
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "services.gateway", LONGRUN_WEBHOOK_PROVIDERS="acme=tests.integration.stamped_hooks:acme",
                   LONGRUN_WEBHOOK_REPLAY_WINDOW="5s")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    stored = await waiting_for_event(engine, "ci/acme/payments/11")
    body = ci_event("acme-1", 11)

    def stamped(sent_at: float) -> dict[str, str]:
        stamp = f"{sent_at:.0f}"
        digest = hmac.new(WEBHOOK_SECRET.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
        return {"x-acme-signature": f"sha256={digest}", "x-acme-timestamp": stamp}

    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        captured = stamped(time.time() - 60)  # a genuine delivery, captured and sent again a minute later
        replayed = await http.post("/webhooks/acme", content=body, headers=captured)
        assert replayed.status_code == 401 and "outside the 5s replay window" in replayed.json()["error"]
        assert await count(engine, "SELECT count(*) FROM webhook_events") == 0
        fresh = await http.post("/webhooks/acme", content=body, headers=stamped(time.time()))
    assert fresh.status_code == 202 and fresh.json()["matched_run_id"] == stored.snapshot.run_id
    async with engine.connect() as conn:
        audit = (await conn.execute(text("SELECT actor, action, target, reason FROM audit_log"))).all()
    assert [tuple(a) for a in audit] == [
        ("webhook:acme", "webhook.refused", "acme", "sent 60s ago, outside the 5s replay window")]


async def test_an_event_that_arrives_before_its_wait_is_kept_and_matched_when_the_wait_starts(
        clean, engine, gateway) -> None:
    response = await post_webhook(gateway, ci_event("early", 9))
    assert response.status_code == 202 and response.json()["matched_run_id"] is None
    stored = await waiting_for_event(engine, "ci/acme/payments/9")
    async with engine.begin() as conn:
        after = await webhooks.match_kept(PgTransaction(conn), stored)
    assert after.snapshot.status.value == "READY"
    assert after.snapshot.fact("ci_result:9") is not None
    assert await count(engine, "SELECT count(*) FROM webhook_events WHERE matched_run_id IS NOT NULL") == 1


async def test_operator_actions_need_a_token_and_a_reason_and_are_audited(clean, engine, gateway) -> None:
    stored = await waiting_for_user(engine, approval_id="merge:1", approved_hash="a" * 64)
    run_id = stored.snapshot.run_id
    auth = {"authorization": f"Bearer {OPERATOR_TOKEN}", "x-operator": "user_42"}
    body = {"approval_id": "merge:1", "approved_hash": "a" * 64, "reason": "reviewed"}
    assert (await gateway.post(f"/runs/{run_id}/approve", json=body)).status_code == 401
    assert (await gateway.post(f"/runs/{run_id}/approve", json={**body, "reason": ""},
                               headers=auth)).status_code == 400
    # Only the owner the request names may decide it
    intruder = await gateway.post(f"/runs/{run_id}/approve", json=body, headers={**auth, "x-operator": "mallory"})
    assert intruder.status_code == 403 and "only user_42 may decide" in intruder.json()["error"]
    # An approval for another hash is refused and changes nothing
    wrong = await gateway.post(f"/runs/{run_id}/approve", json={**body, "approved_hash": "b" * 64}, headers=auth)
    assert wrong.status_code == 409 and "pending request is" in wrong.json()["error"]
    async with engine.connect() as conn:
        assert await runs.load(conn, run_id) == stored
    ok = await gateway.post(f"/runs/{run_id}/approve", json=body, headers=auth)
    assert ok.status_code == 200 and ok.json()["status"] == "READY"
    async with engine.connect() as conn:
        audit = (await conn.execute(text("SELECT actor, action, target, reason FROM audit_log"))).all()
    assert [tuple(a) for a in audit] == [("user_42", "approve", run_id, "reviewed")]


async def test_a_migration_to_a_version_this_deployment_lacks_is_refused_naming_it(clean, engine, gateway) -> None:
    stored = await waiting_for_user(engine, approval_id="merge:1", approved_hash="a" * 64)
    run_id = stored.snapshot.run_id
    auth = {"authorization": f"Bearer {OPERATOR_TOKEN}", "x-operator": "ops"}
    missing = await gateway.post(f"/runs/{run_id}/migrate", json={"reason": "release 2"}, headers=auth)
    assert missing.status_code == 400 and "to_version" in missing.json()["error"]
    refused = await gateway.post(f"/runs/{run_id}/migrate", json={"to_version": "2", "reason": "release 2"},
                                 headers=auth)
    assert refused.status_code == 409
    assert "no run kind 'dependency_upgrade' at workflow version '2'" in refused.json()["error"]
    async with engine.connect() as conn:
        assert await runs.load(conn, run_id) == stored
