"""The gateway over HTTP: signed webhooks deduplicated into one transition, audited operator actions."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from longrun import webhook_providers
from longrun.app.gateway import webhooks
from longrun.config import Settings
from longrun.db import audit as audit_log
from longrun.db import runs
from longrun.db.transaction import PgTransaction
from longrun.errors import ConfigError
from longrun_dependency_upgrade.forge import sign_payload
from tests.integration.ensemble import OPERATOR_TOKEN, WEBHOOK_SECRET, Ensemble
from tests.integration.identities import bearer
from tests.integration.runs_factory import waiting_for_event, waiting_for_user

pytestmark = pytest.mark.integration

ACME_SECRET = "acme-own-secret"
"""The stamped acme provider's secret: each provider has its own."""


@pytest.fixture
async def gateway(services, tmp_path):  # type: ignore[no-untyped-def]
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway")
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


@pytest.mark.parametrize(("body", "reason"), [
    # Found by the fuzzer (tests/fuzz): each was a 500 (or a dropped connection) before.
    (b'{"id": "e1", "type": "ci.finished", "ci_run_id": NaN}', "NaN is not a JSON value"),
    (b"[" * 5000 + b"]" * 5000, "nested deeper than the parser's recursion limit"),
    (ci_event("e\u0000", 1), "the text at ['id'] holds U+0000"),
    (ci_event("e2", 2, status="\ud800"), "the text at ['status'] holds U+0000 or a lone surrogate"),
    (ci_event("i" * 4000, 3), "event id of 4000 characters; at most"),
])
async def test_a_signed_delivery_postgresql_cannot_store_is_refused_with_400_naming_why(
        clean, engine, gateway, body: bytes, reason: str) -> None:
    response = await post_webhook(gateway, body)
    assert response.status_code == 400, response.text
    assert reason in response.json()["error"]
    assert await count(engine, "SELECT count(*) FROM webhook_events") == 0


async def test_a_timestamped_delivery_sent_again_outside_the_replay_window_is_refused_and_audited(
        clean, engine, services, tmp_path) -> None:
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway", LONGRUN_WEBHOOK_PROVIDERS="acme=tests.integration.stamped_hooks:acme",
                   LONGRUN_WEBHOOK_SECRETS=f"forge={WEBHOOK_SECRET},acme={ACME_SECRET}", LONGRUN_WEBHOOK_REPLAY_WINDOW="5s")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    stored = await waiting_for_event(engine, "ci/acme/payments/11", provider="acme")
    body = ci_event("acme-1", 11)

    def stamped(sent_at: float) -> dict[str, str]:
        stamp = f"{sent_at:.0f}"
        digest = hmac.new(ACME_SECRET.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
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
    auth = await bearer(engine, "user_42")
    body = {"approval_id": "merge:1", "approved_hash": "a" * 64, "reason": "reviewed"}
    assert (await gateway.post(f"/runs/{run_id}/approve", json=body)).status_code == 401
    assert (await gateway.post(f"/runs/{run_id}/approve", json={**body, "reason": ""},
                               headers=auth)).status_code == 400
    # Only the owner the request names may decide it: not another approver, not the bootstrap admin,
    # and naming oneself in a header changes nothing
    for intruder in (await bearer(engine, "mallory"), {"authorization": f"Bearer {OPERATOR_TOKEN}"}):
        refused = await gateway.post(f"/runs/{run_id}/approve", json=body,
                                     headers={**intruder, "x-operator": "user_42"})
        assert refused.status_code == 403 and "only user_42 may decide" in refused.json()["error"]
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
    auth = {"authorization": f"Bearer {OPERATOR_TOKEN}"}
    missing = await gateway.post(f"/runs/{run_id}/migrate", json={"reason": "release 2"}, headers=auth)
    assert missing.status_code == 400 and "to_version" in missing.json()["error"]
    refused = await gateway.post(f"/runs/{run_id}/migrate", json={"to_version": "3", "reason": "release 3"},
                                 headers=auth)
    assert refused.status_code == 409
    assert "no run kind 'dependency_upgrade' at workflow version '3'" in refused.json()["error"]
    async with engine.connect() as conn:
        assert await runs.load(conn, run_id) == stored


@pytest.fixture
async def ana(clean, engine) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """An admin of every tenant named ana."""
    return await bearer(engine, "ana", "admin")


async def test_a_run_shows_its_lease_next_timer_and_the_operations_allowed_now(ana, clean, engine, gateway) -> None:
    waiting = await waiting_for_event(engine, "ci/acme/payments/12")
    asking = await waiting_for_user(engine, approval_id="merge:1", approved_hash="h1")
    shown = {r.snapshot.run_id: (await gateway.get(f"/runs/{r.snapshot.run_id}", headers=ana)).json()
             for r in (waiting, asking)}
    event_wait, user_wait = shown[waiting.snapshot.run_id], shown[asking.snapshot.run_id]
    assert event_wait["allowed_operations"] == ["pause", "cancel", "terminate"]
    assert event_wait["next_timer"]["kind"] == "wait_deadline" and event_wait["lease"] is None
    assert user_wait["allowed_operations"] == ["approve", "deny", "pause", "cancel", "terminate"]
    assert user_wait["next_timer"] is None
    paused = await gateway.post(f"/runs/{waiting.snapshot.run_id}/pause", headers=ana, json={"reason": "look"})
    assert paused.status_code == 200, paused.text
    again = (await gateway.get(f"/runs/{waiting.snapshot.run_id}", headers=ana)).json()
    assert again["allowed_operations"] == ["cancel", "terminate", "resume"]


async def test_runs_come_a_page_at_a_time_newest_first_each_on_exactly_one_page(ana, clean, engine, gateway) -> None:
    made = [(await waiting_for_event(engine, f"ci/acme/payments/p{i}")).snapshot.run_id for i in range(7)]
    seen: list[str] = []
    cursor: str | None = None
    sizes = []
    while True:
        page = (await gateway.get("/runs", headers=ana, params={
            "tenant_id": "acme", "limit": "3", **({"cursor": cursor} if cursor else {})})).json()
        sizes.append(len(page["runs"]))
        seen += [r["run_id"] for r in page["runs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        await waiting_for_event(engine, f"ci/acme/payments/late-{len(sizes)}")  # newer: not on later pages
    assert sizes == [3, 3, 1] and seen == list(reversed(made))
    older = (await gateway.get("/runs", headers=ana, params={"older_than": "1h"})).json()
    assert older == {"runs": [], "next_cursor": None}
    for params, error in (({"limit": "0"}, "limit must be an integer from 1 to 500, got '0'"),
                          ({"cursor": "bm9wZQ"}, "cursor is not one this API gave out: 'bm9wZQ'"),
                          ({"idle_for": "soon"}, "idle_for must be a duration")):
        refused = await gateway.get("/runs", headers=ana, params=params)
        assert refused.status_code == 400 and refused.json()["error"].startswith(error), refused.text


async def test_the_audit_log_and_the_alerts_are_readable_newest_first(ana, clean, engine, gateway) -> None:
    stored = await waiting_for_event(engine, "ci/acme/payments/13")
    run_id = stored.snapshot.run_id
    for action in ("pause", "resume"):
        assert (await gateway.post(f"/runs/{run_id}/{action}", headers=ana,
                                   json={"reason": f"{action} to look"})).status_code == 200
    async with engine.begin() as conn:
        await audit_log.audit(conn, actor="reconciler", action="alert.silent_run", target=run_id, reason="silent")
    trail = (await gateway.get("/audit", headers=ana, params={"target": run_id})).json()
    assert [(e["actor"], e["action"], e["reason"]) for e in trail["entries"]] == [
        ("reconciler", "alert.silent_run", "silent"), ("ana", "resume", "resume to look"),
        ("ana", "pause", "pause to look")]
    first = (await gateway.get("/audit", headers=ana, params={"actor": "ana", "limit": "1"})).json()
    rest = (await gateway.get("/audit", headers=ana, params={"actor": "ana", "cursor": first["next_cursor"]})).json()
    assert [e["action"] for e in first["entries"] + rest["entries"]] == ["resume", "pause"]
    assert rest["next_cursor"] is None
    alerts = (await gateway.get("/alerts", headers=ana)).json()
    assert [(e["action"], e["target"]) for e in alerts["entries"]] == [("alert.silent_run", run_id)]
    assert (await gateway.get("/audit")).status_code == 401


async def test_longrunctl_pages_runs_attaches_and_reads_the_audit_log_and_alerts(clean, engine, gateway,
                                                                                  tmp_path: Path) -> None:
    made = [(await waiting_for_event(engine, f"ci/acme/payments/c{i}")).snapshot.run_id for i in range(2)]
    async with engine.begin() as conn:
        await audit_log.audit(conn, actor="reconciler", action="alert.drift", target=made[0], reason="drifted")

    def ctl(*args: str) -> Any:
        done = subprocess.run([str(Path(sys.executable).parent / "longrunctl"), "--url", str(gateway.base_url),
                               "-o", "json", "--token", OPERATOR_TOKEN, *args], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    first = await asyncio.to_thread(ctl, "run", "list", "--tenant", "acme", "--limit", "1")
    second = await asyncio.to_thread(ctl, "run", "list", "--tenant", "acme", "--cursor", first["next_cursor"])
    assert [r["run_id"] for r in first["runs"] + second["runs"]] == list(reversed(made))
    evidence = tmp_path / "screenshot.png"
    evidence.write_bytes(b"\x89PNG fake screenshot")
    attached = await asyncio.to_thread(ctl, "run", "attach", made[1], str(evidence), "--media-type", "image/png",
                                       "--reason", "what the console showed")
    assert attached["artifact"]["name"] == "screenshot.png" and attached["artifact"]["media_type"] == "image/png"
    alerts = await asyncio.to_thread(ctl, "alerts")
    audit = await asyncio.to_thread(ctl, "audit", "--target", made[0])
    assert [e["reason"] for e in alerts["entries"]] == [e["reason"] for e in audit["entries"]] == ["drifted"]
    attach = await asyncio.to_thread(ctl, "audit", "--action", "attach")
    assert [(e["target"], e["details"]["name"]) for e in attach["entries"]] == [(made[1], "screenshot.png")]


async def test_an_operator_attaches_an_artifact_the_run_records_and_serves_back(ana, clean, engine, gateway) -> None:
    stored = await waiting_for_event(engine, "ci/acme/payments/14")
    run_id = stored.snapshot.run_id
    log = b"CI log excerpt: 412 passed, 0 failed\n" * 50
    attached = await gateway.post(f"/runs/{run_id}/artifacts", headers={**ana, "content-type": "text/plain"},
                                  params={"name": "ci-log.txt", "reason": "the CI log the far side lost"}, content=log)
    assert attached.status_code == 200, attached.text
    artifact = attached.json()["artifact"]
    assert (artifact["name"], artifact["size"], artifact["media_type"]) == ("ci-log.txt", len(log), "text/plain")
    shown = (await gateway.get(f"/runs/{run_id}", headers=ana)).json()
    [fact] = [f for f in shown["snapshot"]["facts"] if f["key"] == "artifact:ci-log.txt"]
    assert fact["source"] == "operator:ana" and fact["value"]["content_hash"] == artifact["content_hash"]
    served = await gateway.get(f"/runs/{run_id}/artifacts/{artifact['content_hash']}", headers=ana)
    assert (served.status_code, served.content) == (200, log)
    assert served.headers["content-type"].split(";")[0] == "text/plain"
    other = await waiting_for_event(engine, "ci/acme/payments/15")
    assert (await gateway.get(f"/runs/{other.snapshot.run_id}/artifacts/{artifact['content_hash']}",
                              headers=ana)).status_code == 404
    for params, status in (({"name": "../etc", "reason": "r"}, 422), ({"name": "x"}, 400)):
        assert (await gateway.post(f"/runs/{run_id}/artifacts", headers=ana, params=params,
                                   content=b"x")).status_code == status
    assert (await gateway.post("/runs/nope/artifacts", headers=ana, params={"name": "x", "reason": "r"},
                               content=b"x")).status_code == 404
    async with engine.connect() as conn:
        audit = (await conn.execute(text("SELECT actor, action, details->>'name' FROM audit_log "
                                         "WHERE action = 'attach'"))).all()
        registered = (await conn.execute(text("SELECT run_id, size_bytes FROM artifacts WHERE content_hash = :h"),
                                         {"h": artifact["content_hash"]})).one()
    assert [tuple(a) for a in audit] == [("ana", "attach", "ci-log.txt")]
    assert tuple(registered) == (run_id, len(log))


async def test_a_provider_with_a_secret_of_its_own_is_verified_with_it_alone(clean, engine, services,
                                                                             tmp_path) -> None:
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway", LONGRUN_WEBHOOK_SECRETS="forge=the-forge-own-secret")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    await waiting_for_event(engine, "ci/acme/payments/31")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        with_the_default = await post_webhook(http, ci_event("d-1", 31))
        with_its_own = await post_webhook(http, ci_event("d-2", 31), secret="the-forge-own-secret")
    assert with_the_default.status_code == 401 and with_the_default.json()["error"].startswith("refused")
    assert with_its_own.status_code == 202, with_its_own.text
    assert with_its_own.json()["matched_run_id"] is not None


def test_a_secret_for_a_provider_the_gateway_does_not_know_stops_it() -> None:
    settings = Settings.from_env({"LONGRUN_WEBHOOK_SECRETS": "forge=a,githib=b"})
    with pytest.raises(ConfigError, match="LONGRUN_WEBHOOK_SECRETS: no provider 'githib'; known: forge"):
        webhook_providers.secrets(settings, webhook_providers.load(settings))
