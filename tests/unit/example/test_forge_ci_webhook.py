"""The forge's CI over HTTP: it runs the commit's real tests, and its signed webhook is delivered N times."""

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
from longrun_dependency_upgrade.sample_project import FIX_FILES, PLAN_FILES

REPO = "acme/payments"
BRANCH = "deps/payment-sdk-5"


@pytest.fixture
async def client(serve) -> AsyncIterator[ForgeClient]:
    async with ForgeClient(serve(create_app(ci_delay=0.05)).url, timeout=2.0) as forge_client:
        yield forge_client


async def commit_and_run_ci(client: ForgeClient, n: int, files: dict[str, str]) -> CiRun:
    if n == 1:
        await client.create_branch(REPO, name=BRANCH, from_ref="main", idempotency_key="branch")
    commit = await client.create_commit(REPO, branch=BRANCH, files=files, message=f"attempt {n}",
                                        idempotency_key=f"commit:{n}")
    # Each file was rewritten whole on the branch's head, one line changed in each.
    assert commit["diff"]["files"] == [{"path": path, "added": 1, "removed": 1} for path in sorted(files)]
    run = await client.start_ci_run(REPO, sha=commit["sha"], idempotency_key=f"ci:{n}")
    assert run["status"] == "running" and run["sha"] == commit["sha"]
    return run


async def finished(client: ForgeClient, run: CiRun, poll) -> CiRun:
    async def probe():
        current = await client.get_ci_run(REPO, run["id"])
        return current if current["status"] != "running" else None

    return await poll(probe)


async def test_ci_runs_the_commits_tests_the_plan_fails_for_real_and_the_fix_passes(client: ForgeClient,
                                                                                     poll) -> None:
    first = await finished(client, await commit_and_run_ci(client, 1, PLAN_FILES), poll)
    second = await finished(client, await commit_and_run_ci(client, 2, FIX_FILES), poll)

    assert (first["status"], first["summary"]) == ("failed", "1 failed, 2 passed")
    assert "FAILED tests.test_payments.PaymentsTest.test_refund_gives_the_amount_back" in first["log"]
    assert "AttributeError: 'Client' object has no attribute 'charge'" in first["log"]
    assert (second["status"], second["summary"]) == ("passed", "3 passed")
    assert "test_refund_gives_the_amount_back" in second["log"] and "FAILED" not in second["log"]


async def test_a_pin_the_package_index_lacks_fails_ci(client: ForgeClient, poll) -> None:
    run = await finished(client, await commit_and_run_ci(client, 1, {"requirements.txt": "payment-sdk==9.9.9\n"}),
                         poll)

    assert (run["status"], run["summary"]) == ("failed", "no release payment-sdk==9.9.9")


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

    run = await commit_and_run_ci(client, 1, PLAN_FILES)

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
    assert event["log_excerpt"].endswith(
        "FAILED tests.test_payments.PaymentsTest.test_refund_gives_the_amount_back\n1 failed, 2 passed")
