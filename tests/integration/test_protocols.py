"""Pause, resume and terminate, over the real gateway and store: nothing moves while paused, nothing is lost."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import text

from longrun.db import runs
from longrun_dependency_upgrade.forge import sign_payload
from tests.integration.ensemble import WEBHOOK_SECRET, Ensemble
from tests.integration.identities import bearer
from tests.integration.runs_factory import waiting_for_event

pytestmark = pytest.mark.integration
@pytest.fixture
async def oncall(clean, engine) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The token of ops-oncall, an operator."""
    return await bearer(engine, "ops-oncall", "operator")


@pytest.fixture
async def gateway(services, tmp_path):  # type: ignore[no-untyped-def]
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        yield http


async def wakeups(engine) -> int:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM outbox WHERE type = 'run.wakeup'"))).scalar())


async def test_an_event_that_arrives_while_paused_is_kept_and_the_run_moves_only_on_resume(
        oncall, clean, engine, gateway) -> None:
    # Given a waiting run that an operator pauses
    stored = await waiting_for_event(engine, "ci/acme/payments/41")
    run_id = stored.snapshot.run_id
    paused = await gateway.post(f"/runs/{run_id}/pause", json={"reason": "incident 7"}, headers=oncall)
    assert paused.json()["status"] == "PAUSED"
    # When its CI result arrives during the pause
    body = json.dumps({"id": "ci-41", "type": "ci.finished", "ci_run_id": 41, "repo": "acme/payments",
                       "sha": "s", "status": "passed", "log_excerpt": ""}).encode()
    response = await gateway.post("/webhooks/forge", content=body,
                                  headers={"x-forge-signature": sign_payload(WEBHOOK_SECRET, body)})
    # Then the event is recorded, but nothing is scheduled while paused
    assert response.json()["matched_run_id"] == run_id
    async with engine.connect() as conn:
        during = await runs.load(conn, run_id)
    assert during is not None and during.snapshot.status.value == "PAUSED"
    assert during.snapshot.fact("ci_result:41") is not None
    assert await wakeups(engine) == 0
    # and resuming readies the run and wakes a worker exactly once
    resumed = await gateway.post(f"/runs/{run_id}/resume", json={"reason": "incident over"}, headers=oncall)
    assert resumed.json()["status"] == "READY"
    assert await wakeups(engine) == 1


async def test_terminate_is_immediate_and_audited_with_operator_and_reason(oncall, clean, engine, gateway) -> None:
    stored = await waiting_for_event(engine, "ci/acme/payments/42")
    run_id = stored.snapshot.run_id
    response = await gateway.post(f"/runs/{run_id}/terminate", json={"reason": "runaway costs"}, headers=oncall)
    assert response.json()["status"] == "TERMINATED"
    again = await gateway.post(f"/runs/{run_id}/resume", json={"reason": "oops"}, headers=oncall)
    assert again.status_code == 409 and "TERMINATED" in again.json()["error"]
    async with engine.connect() as conn:
        audit = (await conn.execute(text("SELECT actor, action, reason, details FROM audit_log ORDER BY id"))).all()
        after = await runs.load(conn, run_id)
    assert [(a.actor, a.action, a.reason) for a in audit] == [("ops-oncall", "terminate", "runaway costs")]
    assert audit[0].details == {"from": "WAITING_EVENT", "to": "TERMINATED"}
    assert after is not None and after.snapshot.terminal_reason == "terminated by ops-oncall: runaway costs"
