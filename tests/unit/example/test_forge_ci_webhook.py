"""The fake forge's CI: scripted outcomes, and signed webhooks delivered N times."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from longrun_dependency_upgrade.forge import create_app
from longrun_dependency_upgrade.forge_client import CiRun, ForgeClient

REPO = "acme/payments"
BRANCH = "deps/payments-sdk-3"


@pytest.fixture
async def client(serve) -> AsyncIterator[ForgeClient]:
    async with ForgeClient(serve(create_app(ci_delay=0.05)).url, timeout=2.0) as forge_client:
        yield forge_client


async def commit_and_run_ci(client: ForgeClient, n: int) -> CiRun:
    if n == 1:
        await client.create_branch(REPO, name=BRANCH, from_ref="main", idempotency_key="branch")
    commit = await client.create_commit(REPO, branch=BRANCH, files={"payments/client.py": f"# v{n}\n"},
                                        message=f"attempt {n}", idempotency_key=f"commit:{n}")
    run = await client.start_ci_run(REPO, sha=commit["sha"], idempotency_key=f"ci:{n}")
    assert run["status"] == "running" and run["sha"] == commit["sha"]
    return run


async def finished(client: ForgeClient, run: CiRun, poll) -> CiRun:
    async def probe():
        current = await client.get_ci_run(REPO, run["id"])
        return current if current["status"] != "running" else None

    return await poll(probe)


async def test_first_run_of_a_branch_fails_then_passes(client: ForgeClient, poll) -> None:
    first = await finished(client, await commit_and_run_ci(client, 1), poll)
    second = await finished(client, await commit_and_run_ci(client, 2), poll)

    assert first["status"] == "failed"
    assert "PaymentClientTest.testRefund" in first["log"]
    assert "Client.charge" in first["log"] and "Client.create_charge" in first["log"]
    assert second["status"] == "passed"


async def test_repo_script_decides_each_run(client: ForgeClient, poll) -> None:
    await client.set_ci_script(REPO, [{"status": "passed"}, {"status": "failed", "log": "flaky: boom"}])

    outcomes = [await finished(client, await commit_and_run_ci(client, n), poll) for n in (1, 2, 3)]

    assert [(r["status"], r["log"]) for r in outcomes][1] == ("failed", "flaky: boom")
    assert [r["status"] for r in outcomes] == ["passed", "failed", "passed"]


def receiver(received: list[tuple[dict[str, str], bytes]]) -> Starlette:
    async def hook(request: Request) -> JSONResponse:
        received.append((dict(request.headers), await request.body()))
        return JSONResponse({"ok": True})

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/hooks/forge", hook, methods=["POST"]), Route("/healthz", healthz)])


async def test_webhook_is_the_same_signed_event_delivered_n_times(client: ForgeClient, serve, poll) -> None:
    received: list[tuple[dict[str, str], bytes]] = []
    gateway = serve(receiver(received))
    await client.set_webhook(f"{gateway.url}/hooks/forge", "s3cret", deliver_times=3)

    run = await commit_and_run_ci(client, 1)

    async def three_deliveries():
        return len(received) >= 3

    await poll(three_deliveries)
    assert len(received) == 3
    assert len({body for _, body in received}) == 1
    headers, body = received[0]
    expected = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert all(hmac.compare_digest(h["x-forge-signature"], expected) for h, _ in received)
    event = json.loads(body)
    assert headers["x-forge-event-id"] == event["id"]
    assert event["type"] == "ci.finished" and event["ci_run_id"] == run["id"]
    assert (event["repo"], event["sha"], event["status"]) == (REPO, run["sha"], "failed")
    assert "PaymentClientTest.testRefund" in event["log_excerpt"]
