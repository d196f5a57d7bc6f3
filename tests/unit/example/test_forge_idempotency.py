"""The fake forge over real HTTP: idempotency keys, injected faults, and restarts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from longrun_dependency_upgrade.forge import create_app
from longrun_dependency_upgrade.forge_client import ForgeClient
from longrun_dependency_upgrade.sample_project import PLAN_FILES
from longrun.errors import ActionOutcomeUnknown, IdempotencyKeyReused, ToolRejected, ToolUnavailable

REPO = "acme/payments"


@pytest.fixture
def forge(serve):
    return serve(create_app(ci_delay=0.05))


@pytest.fixture
async def client(forge) -> AsyncIterator[ForgeClient]:
    async with ForgeClient(forge.url, timeout=2.0) as forge_client:
        yield forge_client


async def upgrade_branch(client: ForgeClient) -> str:
    """A branch with one commit on it; returns the head sha."""
    await client.create_branch(
        REPO, name="deps/payments-sdk-3", from_ref="main", idempotency_key="run1:branch"
    )
    commit = await client.create_commit(
        REPO, branch="deps/payments-sdk-3", files=PLAN_FILES,
        message="Upgrade payment-sdk to 5.0.0", idempotency_key="run1:commit:1",
    )
    return commit["sha"]


async def open_mr(client: ForgeClient, sha: str, key: str = "run1:mr"):
    return await client.create_merge_request(
        REPO, source_branch="deps/payments-sdk-3", title="Upgrade payments-sdk to 3.0.0",
        description="CI green, approved.", sha=sha, idempotency_key=key,
    )


async def effect_count(client: ForgeClient, key: str) -> int:
    return sum(effect["count"] for effect in await client.effects() if effect["idempotency_key"] == key)


async def test_same_key_and_body_creates_one_object(client: ForgeClient) -> None:
    sha = await upgrade_branch(client)
    first = await open_mr(client, sha)
    again = await open_mr(client, sha)

    assert again == first
    assert first["state"] == "open" and first["number"] == 1
    assert await client.effects() == [
        {"kind": "branch", "idempotency_key": "run1:branch", "count": 1},
        {"kind": "commit", "idempotency_key": "run1:commit:1", "count": 1},
        {"kind": "merge_request", "idempotency_key": "run1:mr", "count": 1},
    ]


async def test_replay_is_marked_and_key_is_required(forge, client: ForgeClient) -> None:
    await client.create_branch(REPO, name="b", from_ref="main", idempotency_key="k-branch")
    async with httpx.AsyncClient(base_url=forge.url) as http:
        replay = await http.post(f"/repos/{REPO}/branches", json={"name": "b", "from": "main"},
                                 headers={"Idempotency-Key": "k-branch"})
        keyless = await http.post(f"/repos/{REPO}/branches", json={"name": "c", "from": "main"})

    assert replay.status_code == 201 and replay.headers["Idempotent-Replayed"] == "true"
    assert keyless.status_code == 400 and keyless.json()["error"] == "idempotency_key_required"


async def test_same_key_other_body_is_refused_naming_both_hashes(forge, client: ForgeClient) -> None:
    await client.create_branch(REPO, name="b1", from_ref="main", idempotency_key="k")
    async with httpx.AsyncClient(base_url=forge.url) as http:
        response = await http.post(f"/repos/{REPO}/branches", json={"name": "b2", "from": "main"},
                                   headers={"Idempotency-Key": "k"})
    body = response.json()

    assert response.status_code == 422
    assert body["recorded_request_hash"] != body["offered_request_hash"]
    assert body["recorded_request_hash"] in body["detail"] and body["offered_request_hash"] in body["detail"]
    with pytest.raises(IdempotencyKeyReused) as refused:
        await client.create_branch(REPO, name="b2", from_ref="main", idempotency_key="k")
    assert refused.value.recorded_hash == body["recorded_request_hash"]
    assert await effect_count(client, "k") == 1


async def test_timeout_after_commit_is_unknown_and_reconciles_to_one_mr(forge, client: ForgeClient) -> None:
    sha = await upgrade_branch(client)
    await client.set_fault("merge_requests", "timeout_after_commit", hold_seconds=5)

    async with ForgeClient(forge.url, timeout=0.3) as impatient:
        with pytest.raises(ActionOutcomeUnknown) as unknown:
            await open_mr(impatient, sha)
    assert unknown.value.idempotency_key == "run1:mr"
    assert unknown.value.tool == "forge.create_merge_request"

    found = await client.lookup("run1:mr")
    assert found is not None and found["kind"] == "merge_request"
    assert found["object"]["sha"] == sha and found["object"]["number"] == 1
    assert await effect_count(client, "run1:mr") == 1
    # Retrying with the same key after reconciliation returns the same MR, not a second one.
    assert (await open_mr(client, sha))["id"] == found["object"]["id"]
    assert await effect_count(client, "run1:mr") == 1


async def test_error_500_after_commit_is_unknown_not_failed(client: ForgeClient) -> None:
    await client.set_fault("branches", "error_500_after_commit")

    with pytest.raises(ActionOutcomeUnknown):
        await client.create_branch(REPO, name="b", from_ref="main", idempotency_key="k500")

    found = await client.lookup("k500")
    assert found is not None and found["object"]["name"] == "b"
    assert await effect_count(client, "k500") == 1


async def test_fail_before_commit_is_retryable_and_creates_nothing(client: ForgeClient) -> None:
    await client.create_branch(REPO, name="b", from_ref="main", idempotency_key="kb")
    await client.set_fault("commits", "fail_before_commit", times=2)

    for _ in range(2):
        with pytest.raises(ToolUnavailable):
            await client.create_commit(REPO, branch="b", files={"a": "1"}, message="m", idempotency_key="kc")
        assert await client.lookup("kc") is None
        assert await effect_count(client, "kc") == 0

    commit = await client.create_commit(REPO, branch="b", files={"a": "1"}, message="m", idempotency_key="kc")
    assert (await client.lookup("kc"))["object"]["sha"] == commit["sha"]
    assert await effect_count(client, "kc") == 1


async def test_refused_requests_are_definite_rejections(client: ForgeClient) -> None:
    sha = await upgrade_branch(client)
    await open_mr(client, sha)

    with pytest.raises(ToolRejected) as stale:
        await open_mr(client, "0" * 40, key="other-key-stale")
    with pytest.raises(ToolRejected) as duplicate:
        await open_mr(client, sha, key="other-key-dup")
    with pytest.raises(ToolRejected) as missing:
        await client.create_commit(REPO, branch="nope", files={}, message="m", idempotency_key="kx")

    assert (stale.value.status, duplicate.value.status, missing.value.status) == (409, 409, 404)
    assert "open merge request exists" in duplicate.value.detail
    assert [e["kind"] for e in await client.effects()].count("merge_request") == 1


async def test_unreachable_forge_is_unavailable_not_unknown(serve) -> None:
    stopped = serve(create_app())
    stopped.stop()
    async with ForgeClient(stopped.url, timeout=1.0) as client:
        with pytest.raises(ToolUnavailable):
            await client.create_branch(REPO, name="b", from_ref="main", idempotency_key="k")


async def test_connection_dropped_after_sending_is_unknown() -> None:
    async def read_then_hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(read_then_hang_up, "127.0.0.1", 0)
    async with server, ForgeClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}") as client:
        with pytest.raises(ActionOutcomeUnknown) as unknown:
            await open_mr(client, "0" * 40)
    assert "RemoteProtocolError" in unknown.value.cause


async def test_state_survives_a_restart(serve, poll, tmp_path: Path) -> None:
    state = str(tmp_path / "forge.sqlite")
    first = serve(create_app(state, ci_delay=0.6))
    async with ForgeClient(first.url, timeout=2.0) as client:
        sha = await upgrade_branch(client)
        run = await client.start_ci_run(REPO, sha=sha, idempotency_key="run1:ci:1")
        mr = await open_mr(client, sha)
        effects = await client.effects()
    first.stop()

    second = serve(create_app(state, ci_delay=0.6))
    async with ForgeClient(second.url, timeout=2.0) as client:
        assert await client.effects() == effects
        assert (await client.lookup("run1:mr"))["object"] == mr
        assert await open_mr(client, sha) == mr
        assert await effect_count(client, "run1:mr") == 1

        async def finished():
            current = await client.get_ci_run(REPO, run["id"])
            return current if current["status"] != "running" else None

        # The run was still going when the forge stopped; it finishes after the restart, on the git
        # repository kept beside the state: the plan's commit fails one real test.
        assert [(await poll(finished))[k] for k in ("status", "summary")] == ["failed", "1 failed, 2 passed"]


async def test_an_outage_answers_503_to_every_call_for_its_window_and_counts_them(client: ForgeClient) -> None:
    # Given a forge down for one second from now
    await client.set_unavailable(1.0)
    # When the runtime's client calls it, reads and writes alike
    with pytest.raises(ToolUnavailable, match="503"):
        await client.create_branch(REPO, name="outage", from_ref="main", idempotency_key="outage:branch")
    with pytest.raises(ToolUnavailable, match="503"):
        await client.lookup("outage:branch")
    # Then each call was refused, counted, and nothing was created; after the window it acts again
    report = await client.unavailable()
    assert report["calls"] == 2 and 0 < report["remaining_seconds"] <= 1.0
    assert await client.effects() == []
    await asyncio.sleep(1.05)
    await client.create_branch(REPO, name="outage", from_ref="main", idempotency_key="outage:branch")
    assert [e["count"] for e in await client.effects()] == [1]
    assert (await client.unavailable())["calls"] == 2
