"""A call that times out after the far side acted is UNKNOWN, never FAILED, and never blindly repeated."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import text

from longrun.db import actions as ledger
from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, goal, new_key, publish_create, run_id_for, status_of
from tests.integration.identities import bearer

pytestmark = pytest.mark.integration


async def approve_when_asked(engine, ensemble: Ensemble, run_id: str) -> bool:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        wait = (await conn.execute(text(
            "SELECT data->'wait' FROM run_events WHERE run_id = :r AND type = 'run.wait_started' "
            "AND data->>'status' = 'WAITING_USER' ORDER BY seq DESC LIMIT 1"), {"r": run_id})).scalar()
    if wait is None:
        return False
    async with httpx.AsyncClient(base_url=ensemble.gateway_url) as gateway:
        response = await gateway.post(f"/runs/{run_id}/approve", json={
            "approval_id": wait["approval_id"], "approved_hash": wait["approved_hash"], "reason": "looks right"},
            headers=await bearer(engine, wait["owner"]))
    return response.status_code == 200


@pytest.mark.long
async def test_a_merge_request_that_times_out_after_creation_parks_the_run_in_action_unknown(
        clean, engine, bus, services, tmp_path) -> None:
    # Given the ensemble without a reconciler, and a forge that creates the merge request then hangs
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_forge()
    ensemble.start_services("gateway", "scheduler", "worker", "relay", LONGRUN_FORGE_TIMEOUT="2")
    await ensemble.configure_forge(faults=({"endpoint": "merge_requests", "mode": "timeout_after_commit",
                                            "times": 1, "hold_seconds": 10},))
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_=goal("unknown"))
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
    # When the run reaches its approval and the merge request call times out
    await eventually(lambda: approve_when_asked(engine, ensemble, run_id), timeout=60, what="the approval")
    await eventually(lambda: _status_is(engine, run_id, "ACTION_UNKNOWN"), timeout=30, what="ACTION_UNKNOWN")
    # Then the action is UNKNOWN (not FAILED), the run waits, and nothing was created twice
    async with engine.connect() as conn:
        rows = {r.logical_action: r for r in await ledger.for_run(conn, run_id)}
        submitted = (await conn.execute(text(
            "SELECT count(*) FROM run_events WHERE run_id = :r AND type = 'action.submitted' "
            "AND data->>'logical_action' = 'merge_request'"), {"r": run_id})).scalar()
    assert rows["merge_request"].status == "UNKNOWN"
    assert submitted == 1
    merge_requests = [e for e in await ensemble.forge_effects() if e["kind"] == "merge_request"]
    assert [e["count"] for e in merge_requests] == [1]
    assert merge_requests[0]["idempotency_key"] == rows["merge_request"].idempotency_key
    assert await status_of(engine, run_id) == "ACTION_UNKNOWN"


async def _status_is(engine, run_id: str, status: str) -> bool:  # type: ignore[no-untyped-def]
    return await status_of(engine, run_id) == status
