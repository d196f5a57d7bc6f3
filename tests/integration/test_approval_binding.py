"""An approval is bound to the hash of what was approved: a changed diff voids it and a new one is asked."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import text

from longrun_dependency_upgrade.forge import sign_payload
from longrun_dependency_upgrade.forge_client import ForgeClient
from tests.fixtures import eventually
from tests.integration.ensemble import (
    WEBHOOK_SECRET,
    Ensemble,
    goal,
    new_key,
    publish_create,
    run_id_for,
    status_of,
)
from tests.integration.identities import bearer

pytestmark = pytest.mark.integration


async def approval_requests(engine, run_id: str) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    async with engine.connect() as conn:
        return list((await conn.execute(text(
            "SELECT data->'wait' FROM run_events WHERE run_id = :r AND type = 'run.wait_started' "
            "AND data->>'status' = 'WAITING_USER' ORDER BY seq"), {"r": run_id})).scalars())


async def approve(ensemble: Ensemble, engine,  # type: ignore[no-untyped-def]
                  run_id: str, wait: dict) -> httpx.Response:  # type: ignore[type-arg]
    async with httpx.AsyncClient(base_url=ensemble.gateway_url) as gateway:
        return await gateway.post(f"/runs/{run_id}/approve", json={
            "approval_id": wait["approval_id"], "approved_hash": wait["approved_hash"], "reason": "reviewed"},
            headers=await bearer(engine, "user_42"))


async def test_a_push_after_the_approval_request_voids_it_and_a_new_one_is_asked(
        clean, engine, bus, services, tmp_path) -> None:
    # Given a run waiting for approval of the merge request at its own last commit (hash H1)
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_forge()
    ensemble.start_services("gateway", "scheduler", "worker", "relay")
    await ensemble.configure_forge()
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")  # the forge's webhooks are delivered once
    key = new_key()
    input_ = goal("push")
    await publish_create(bus, tenant="acme", key=key, input_=input_)
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
    first = (await eventually(lambda: approval_requests(engine, run_id), timeout=60, what="approval asked"))[0]
    # When someone else pushes to the branch and the forge reports it by webhook
    async with ForgeClient(ensemble.forge_url) as forge:
        pushed = await forge.create_commit(input_["repo"], branch=input_["branch"], files={"README": "bob\n"},
                                           message="bob's change", idempotency_key="bob-push-1")
    body = json.dumps({"id": "push-1", "type": "branch.pushed", "repo": input_["repo"], "branch": input_["branch"],
                       "sha": pushed["sha"], "pusher": "bob"}).encode()
    async with httpx.AsyncClient(base_url=ensemble.gateway_url) as gateway:
        response = await gateway.post("/webhooks/forge", content=body,
                                      headers={"x-forge-signature": sign_payload(WEBHOOK_SECRET, body)})
    assert response.status_code == 202 and response.json()["matched_run_id"] == run_id
    # Then approving what was asked before is refused, and a new approval is asked for the new head
    refused = await approve(ensemble, engine, run_id, first)
    assert refused.status_code == 409, refused.text
    requests = await eventually(lambda: _at_least(approval_requests(engine, run_id), 2), timeout=60,
                                what="a new approval request")
    second = requests[1]
    assert second["approved_hash"] != first["approved_hash"]
    assert pushed["sha"] in second["subject"]
    # and approving the new hash merges exactly the new head, once
    assert (await approve(ensemble, engine, run_id, second)).status_code == 200
    await eventually(lambda: _completed(engine, run_id), timeout=30, what="completion")
    merge_requests = [e for e in await ensemble.forge_effects() if e["kind"] == "merge_request"]
    assert [e["count"] for e in merge_requests] == [1]
    async with engine.connect() as conn:
        request = (await conn.execute(text(
            "SELECT request FROM actions WHERE run_id = :r AND logical_action = 'merge_request'"),
            {"r": run_id})).scalar()
    assert request["sha"] == pushed["sha"]


async def _at_least(requests, n: int):  # type: ignore[no-untyped-def]
    found = await requests
    return found if len(found) >= n else None


async def _completed(engine, run_id: str) -> bool:  # type: ignore[no-untyped-def]
    return await status_of(engine, run_id) == "COMPLETED"
