"""Quarantine operations: list with reason and owner; replay one after re-validation, never blindly."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from sqlalchemy import text

from longrun.db import quarantine
from tests.integration.bus_helpers import wakeup
from tests.integration.ensemble import Ensemble
from tests.integration.identities import bearer

pytestmark = pytest.mark.integration
@pytest.fixture
async def oncall(clean, engine) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The token of ops-oncall, an operator."""
    return await bearer(engine, "ops-oncall", "operator")


async def test_listing_shows_reasons_and_replay_revalidates_and_publishes_once(oncall, clean, engine, bus, services,
                                                                              tmp_path) -> None:
    # Given a message the worker gave up on (a bug since fixed) and one that is still malformed
    good = wakeup("run-q", "after-fix")
    async with engine.begin() as conn:
        good_id = await quarantine.put(conn, owner="worker", queue="longrun.worker.p3", body=good.model_dump_json().encode(),
                                       headers={}, message_id=good.event_id, error_code="handler_error",
                                       reason="KeyError: 'x'", attempts=5)
        bad_id = await quarantine.put(conn, owner="worker", queue="longrun.worker.p3", body=b"{broken",
                                      headers={}, message_id="raw", error_code="decode_error",
                                      reason="malformed message: body is not JSON", attempts=1)
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, headers=oncall) as gateway:
        # When an operator lists the quarantine
        listed = (await gateway.get("/quarantine")).json()
        assert [(e["id"], e["owner"], e["error_code"], e["reason"]) for e in listed] == [
            (good_id, "worker", "handler_error", "KeyError: 'x'"),
            (bad_id, "worker", "decode_error", "malformed message: body is not JSON")]
        # Then a still-invalid message is refused with its reason and stays
        refused = await gateway.post(f"/quarantine/{bad_id}/replay", json={"reason": "try again"})
        assert refused.status_code == 409 and "still invalid" in refused.json()["error"]
        # and a valid one is replayed to its original queue, once
        replayed = await gateway.post(f"/quarantine/{good_id}/replay", json={"reason": "consumer fixed"})
        assert replayed.status_code == 200 and replayed.json()["replayed_to"] == "longrun.work.worker/p.3"
        again = await gateway.post(f"/quarantine/{good_id}/replay", json={"reason": "twice?"})
        assert again.status_code == 409 and "already replayed by ops-oncall" in again.json()["error"]
        assert [e["id"] for e in (await gateway.get("/quarantine")).json()] == [bad_id]
    assert json.loads(await _next_message(bus, "longrun.worker.p3"))["event_id"] == good.event_id
    async with engine.connect() as conn:
        audit = (await conn.execute(text("SELECT actor, action, target FROM audit_log"))).all()
    assert [tuple(a) for a in audit] == [("ops-oncall", "quarantine.replay", str(good_id))]


async def _next_message(bus, queue_name: str) -> bytes:  # type: ignore[no-untyped-def]
    """Consume one message (basic.get is not allowed on single-active-consumer quorum queues)."""
    assert bus.connection is not None
    channel = await bus.connection.channel()
    queue = await channel.get_queue(queue_name, ensure=False)
    received: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def take(message) -> None:  # type: ignore[no-untyped-def]
        await message.ack()
        if not received.done():
            received.set_result(message.body)

    await queue.consume(take)
    try:
        return await asyncio.wait_for(received, timeout=10)
    finally:
        await channel.close()
