"""Every bad request is a 4xx, early: each route of the gateway's apps under hostile input, bodies
past their route's limit refused before they are buffered, and the audit log's tenant scope."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from starlette.routing import Mount, Route

from longrun.config import Settings
from longrun.services.gateway.http import create_app
from tests.integration.ensemble import OPERATOR_TOKEN, Ensemble
from tests.integration.identities import bearer
from tests.integration.runs_factory import created, waiting_for_user

pytestmark = pytest.mark.integration

SAMPLES = {
    "/webhooks/{provider}": {"provider": "forge"},
    "/runs": {},
    "/runs/{run_id}": {"run_id": "no-such-run"},
    "/runs/{run_id}/artifacts": {"run_id": "no-such-run"},
    "/runs/{run_id}/artifacts/{content_hash}": {"run_id": "no-such-run", "content_hash": "0" * 64},
    "/runs/{run_id}/{action}": {"run_id": "no-such-run", "action": "approve"},
    "/versions": {}, "/audit": {}, "/alerts": {}, "/quarantine": {},
    "/quarantine/{entry_id}/replay": {"entry_id": "1"},
    "/tenants/{tenant_id}/policy": {"tenant_id": "acme"},
    "/tenants/{tenant_id}/limits": {"tenant_id": "acme"},
    "/tenants/{tenant_id}/limits/ceiling": {"tenant_id": "acme"},
    "/console/limits": {}, "/console/tenants/{tenant_id}/limits": {"tenant_id": "acme"},
    "/tenants/{tenant_id}/ceiling": {"tenant_id": "acme"},
    "/me": {}, "/tokens": {}, "/tokens/{token_id}/revoke": {"token_id": "1"},
    "/openapi.json": {}, "/healthz": {},
    "/console/": {}, "/console/sign-in": {}, "/console/oidc/start": {}, "/console/oidc/callback": {},
    "/console/sign-out": {}, "/console/runs": {}, "/console/runs/{run_id}": {"run_id": "no-such-run"},
    "/console/runs/{run_id}/stream": {"run_id": "no-such-run"},
    "/runs/{run_id}/events/stream": {"run_id": "no-such-run"},
    "/console/runs/{run_id}/{action:str}": {"run_id": "no-such-run", "action": "approve"},
    "/console/quarantine": {}, "/console/quarantine/{entry_id}/replay": {"entry_id": "1"},
    "/console/audit": {},
    "/schedules": {}, "/schedules/{schedule_id}": {"schedule_id": "no-such-schedule"},
    **{f"/schedules/{{schedule_id}}/{act}": {"schedule_id": "no-such-schedule"}
       for act in ("pause", "resume", "backfill", "delete")},
    "/console/schedules": {},
    "/console/schedules/{schedule_id}/{act:str}": {"schedule_id": "no-such-schedule", "act": "pause"},
}
"""A value for each path parameter of each route: a route missing here fails the walk."""
HOSTILE_VALUES = ("%00", "%FF%FE", "..%2F..%2Fetc", "x" * 5000, "-1", "99999999999999999999999")
DEEP = b"[" * 5000 + b"]" * 5000
DEEP_OBJECT = b'{"a":' * 5000 + b"1" + b"}" * 5000


def route_table(app: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """Every (method, path template) the app routes, mounted apps' routes included."""
    for route in app.routes:
        if isinstance(route, Mount):
            yield from route_table(route, prefix + route.path)
        elif isinstance(route, Route):
            for method in sorted(route.methods or ()):
                yield method, prefix + route.path


def filled(template: str, values: dict[str, str]) -> str:
    return re.sub(r"{(\w+)(:\w+)?}", lambda m: values[m.group(1)], template)


def hostile_requests(method: str, template: str) -> Iterator[dict[str, Any]]:
    admin = f"Bearer {OPERATOR_TOKEN}"
    samples = SAMPLES[template]
    path = filled(template, samples)
    yield {"method": method, "url": path}
    yield {"method": method, "url": path, "headers": {"authorization": b"Bearer \xff\xfe\x80"}}
    yield {"method": method, "url": path, "headers": {"authorization": "Bearer a.b.c"}}
    yield {"method": method, "url": path, "headers": {"cookie": b"longrun_console=\xff.\x80; x=\xfe"}}
    yield {"method": method, "url": path + "?limit=-1&cursor=%FF%00&status=%00&all=2&name=%00&reason=x",
           "headers": {"authorization": admin}}
    for body in (DEEP, DEEP_OBJECT, b"\xff\xfe not json", b'{"reason": "\\ud800"}', b"[" * 200_000):
        for content_type in ("application/json", "application/x-www-form-urlencoded"):
            yield {"method": method, "url": path, "content": body,
                   "headers": {"authorization": admin, "content-type": content_type,
                               "x-forge-signature": b"sha256=\xff\xfe", "x-acme-signature": "sha256=00"}}
    yield {"method": method, "url": path, "content": b"{}",
           "headers": {"authorization": admin, "content-length": "12abc"}}
    yield {"method": method, "url": path, "content": b"{}",
           "headers": {"authorization": admin, "content-length": str(2**62)}}
    for name in samples:
        for value in HOSTILE_VALUES:
            yield {"method": method, "url": filled(template, {**samples, name: value}),
                   "headers": {"authorization": admin}, "content": b'{"reason": "x"}'}


@pytest.fixture
async def apps(services, engine, bus, tmp_path):  # type: ignore[no-untyped-def]
    settings = Settings.from_env(services.env(**Ensemble(services, tmp_path).env))
    return [create_app(engine, bus, settings), create_app(engine, bus, settings, operator_api=False)]


async def test_no_route_of_the_gateway_answers_a_hostile_request_with_a_5xx(clean, apps) -> None:
    table = sorted({entry for app in apps for entry in route_table(app)})
    # Every route is covered: a new route without a sample fails here rather than going unwalked.
    assert {template for _, template in table} - set(SAMPLES) == set()
    server_errors = []
    for app in apps:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            for method, template in sorted(set(route_table(app))):
                for request in hostile_requests(method, template):
                    response = await http.request(**request)
                    if response.status_code >= 500:
                        server_errors.append((method, request["url"][:80], response.status_code))
    assert server_errors == []


async def test_head_answers_as_get_without_a_body(clean, apps) -> None:
    transport = httpx.ASGITransport(app=apps[0])
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        got = await http.get("/runs", headers={"authorization": f"Bearer {OPERATOR_TOKEN}"})
        head = await http.head("/runs", headers={"authorization": f"Bearer {OPERATOR_TOKEN}"})
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-length"] == got.headers["content-length"]


async def test_a_nested_body_is_refused_with_400_naming_the_depth(clean, engine, apps) -> None:
    stored = await created(engine)
    transport = httpx.ASGITransport(app=apps[0])
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        nested: Any = "x"
        for _ in range(65):
            nested = [nested]
        response = await http.post(f"/runs/{stored.snapshot.run_id}/pause", content=json.dumps(
            {"reason": "r", "extra": nested}), headers={"authorization": f"Bearer {OPERATOR_TOKEN}"})
    assert response.status_code == 400 and "nested more than 64 deep" in response.json()["error"]


# --- bodies past their limit, against the gateway's process ---------------------------------------

HUGE = 300 * 1024 * 1024
CHUNK = b"a" * (64 * 1024)


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def send_huge(port: int, path: str, headers: dict[str, str], *, chunked: bool, size: int = HUGE) -> int:
    """POST ``size`` bytes of body, streamed (never held), until the gateway answers; its status."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    framing = {"transfer-encoding": "chunked"} if chunked else {"content-length": str(size)}
    head = "".join(f"{k}: {v}\r\n" for k, v in {"host": "gateway", **headers, **framing}.items())
    writer.write(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode())
    answered = asyncio.create_task(reader.readline())
    sent = 0
    try:
        while sent < size and not answered.done():
            writer.write(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK) if chunked else CHUNK)
            await writer.drain()
            sent += len(CHUNK)
        if chunked and not answered.done():
            writer.write(b"0\r\n\r\n")
    except (ConnectionError, OSError):
        pass
    status_line = await asyncio.wait_for(answered, timeout=30)
    writer.close()
    return int(status_line.split()[1])


@pytest.fixture
async def gateway_process(services, tmp_path):  # type: ignore[no-untyped-def]
    ensemble = Ensemble(services, tmp_path)
    process = ensemble.start("gateway", "longrun.services.gateway", LONGRUN_MAX_ATTACHMENT_BYTES="1000")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    return ensemble, process


async def test_a_300_mb_body_is_refused_with_413_without_the_gateway_growing(clean, engine, gateway_process) -> None:
    ensemble, process = gateway_process
    port = ensemble.gateway_port
    stored = await created(engine)
    admin = {"authorization": f"Bearer {OPERATOR_TOKEN}", "content-type": "application/json"}
    targets = [("/webhooks/forge", {"content-type": "application/json", "x-forge-signature": "sha256=00"}),
               ("/console/sign-in", {"content-type": "application/x-www-form-urlencoded"}),
               (f"/runs/{stored.snapshot.run_id}/pause", admin)]
    for path, headers in targets:  # warm every route up before the baseline
        assert await send_huge(port, path, headers, chunked=False, size=2) < 500
    baseline, peak = rss(process.pid), 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, rss(process.pid))
            await asyncio.sleep(0.005)
    watching = asyncio.create_task(watch())
    try:
        statuses = [(path, chunked, await send_huge(port, path, headers, chunked=chunked))
                    for path, headers in targets for chunked in (False, True)]
    finally:
        watching.cancel()
    assert statuses == [(path, chunked, 413) for path, _ in targets for chunked in (False, True)]
    assert peak - baseline < 10 * 1024 * 1024, f"the gateway grew by {(peak - baseline) / 2**20:.1f} MB"


async def test_an_attachment_one_byte_over_its_limit_is_413_before_anything_is_stored(
        clean, engine, services, gateway_process) -> None:
    ensemble, _ = gateway_process
    stored = await created(engine)
    path = f"/runs/{stored.snapshot.run_id}/artifacts?name=log&reason=evidence"
    headers = {"authorization": f"Bearer {OPERATOR_TOKEN}", "content-type": "text/plain"}
    statuses = [await send_huge(ensemble.gateway_port, path, headers, chunked=chunked, size=1001)
                for chunked in (False, True)]
    assert statuses == [413, 413]
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM artifacts"))).scalar() == 0
    store = Path(services.env()["LONGRUN_ARTIFACT_DIR"])
    assert not store.exists() or not any(p.is_file() for p in store.rglob("*"))
    async with httpx.AsyncClient(base_url=ensemble.gateway_url) as http:
        at_limit = await http.post(path, content=b"x" * 1000, headers=headers)
        assert at_limit.status_code == 200
        content_hash = at_limit.json()["artifact"]["content_hash"]
        served = await http.get(f"/runs/{stored.snapshot.run_id}/artifacts/{content_hash}", headers=headers)
    # Served as an attachment, never sniffed into a page
    assert served.content == b"x" * 1000
    assert served.headers["content-disposition"].startswith("attachment")
    assert served.headers["x-content-type-options"] == "nosniff"


# --- refusals and the audit log -------------------------------------------------------------------

async def test_forged_webhooks_are_audited_by_sample_not_each(clean, engine, apps) -> None:
    transport = httpx.ASGITransport(app=apps[1])
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        statuses = {(await http.post("/webhooks/forge", content=b"{}", headers={"x-forge-signature": "sha256=0"}
                                     )).status_code for _ in range(50)}
    assert statuses == {401}
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT details FROM audit_log WHERE action = 'webhook.refused'"))).all()
    assert len(rows) == 1 and rows[0].details["refused_unaudited_before"] == 0


async def test_a_viewer_of_a_tenant_named_like_a_provider_sees_only_its_tenants_entries(
        clean, engine, apps) -> None:
    # Given a forged webhook for provider "forge", a policy change and an approval in tenant "acme"
    acme_run = await waiting_for_user(engine, approval_id="ap-1", approved_hash="h1")
    own_run = await created(engine, tenant="forge")
    admin = {"authorization": f"Bearer {OPERATOR_TOKEN}"}
    transport = httpx.ASGITransport(app=apps[0])
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        assert (await http.post("/webhooks/forge", content=b"{}",
                                headers={"x-forge-signature": "sha256=0"})).status_code == 401
        for tenant in ("acme", "forge"):
            assert (await http.put(f"/tenants/{tenant}/policy", headers=admin, json={
                "tools": ["*"], "resources": ["*"], "reason": f"{tenant} policy"})).status_code == 200
        for run in (acme_run, own_run):
            assert (await http.post(f"/runs/{run.snapshot.run_id}/pause", headers=admin,
                                    json={"reason": "hold"})).status_code in (200, 409)
        # When a viewer of the tenant "forge" (named like the provider) reads the audit log
        viewer = await bearer(engine, "fiona", "viewer", tenants=("forge",))
        entries = (await http.get("/audit", headers=viewer)).json()["entries"]
    # Then it sees its tenant's policy and run, and neither the provider's refusals nor acme's entries
    assert {(e["action"], e["target"]) for e in entries} <= {("tenant_policy.set", "forge"),
                                                              ("pause", own_run.snapshot.run_id)}
    assert ("tenant_policy.set", "forge") in {(e["action"], e["target"]) for e in entries}


# --- unauthenticated and malformed requests, against the gateway's process ------------------------

async def test_an_unauthenticated_head_is_refused_with_401_and_no_body(clean, gateway_process) -> None:
    ensemble, _ = gateway_process
    async with httpx.AsyncClient(base_url=ensemble.gateway_url) as http:
        answers = {path: await http.head(path) for path in ("/runs", "/runs/no-such-run", "/audit", "/me")}
    assert {path: (a.status_code, a.content) for path, a in answers.items()} == {
        path: (401, b"") for path in answers}


async def test_a_webhook_signature_holding_a_non_ascii_byte_is_refused_as_unauthenticated(
        clean, engine, gateway_process) -> None:
    ensemble, _ = gateway_process
    async with httpx.AsyncClient(base_url=ensemble.gateway_url) as http:
        statuses = {(await http.post("/webhooks/forge", content=b'{"id": "e-1"}', headers={
            "content-type": "application/json", "x-forge-signature": signature})).status_code
            for signature in (b"sha256=\xff\xfe", b"sha256=\xe9" + b"0" * 63, b"\x80")}
    assert statuses <= {400, 401}
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM webhook_events"))).scalar() == 0


async def test_a_json_body_nested_5000_deep_is_refused_with_400(clean, engine, gateway_process) -> None:
    ensemble, _ = gateway_process
    stored = await created(engine)
    admin = {"authorization": f"Bearer {OPERATOR_TOKEN}", "content-type": "application/json"}
    async with httpx.AsyncClient(base_url=ensemble.gateway_url) as http:
        answers = [await http.post(f"/runs/{stored.snapshot.run_id}/pause", content=body, headers=admin)
                   for body in (DEEP, DEEP_OBJECT)]
    assert [a.status_code for a in answers] == [400, 400]
    assert all("nested more than 64 deep" in a.json()["error"] for a in answers)
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT status FROM runs WHERE run_id = :r"),
                                   {"r": stored.snapshot.run_id})).scalar() != "PAUSED"


async def test_unauthenticated_refusals_write_no_audit_row_each(clean, engine, gateway_process) -> None:
    ensemble, _ = gateway_process
    stored = await created(engine)
    run = f"/runs/{stored.snapshot.run_id}"
    refused = []
    async with httpx.AsyncClient(base_url=ensemble.gateway_url) as http:
        for attempt in range(20):
            forged = {"authorization": f"Bearer lrt_forged{attempt}"}
            refused += [(await http.get("/runs")).status_code, (await http.head("/audit")).status_code,
                        (await http.get(run, headers=forged)).status_code,
                        (await http.post(f"{run}/pause", json={"reason": "r"}, headers=forged)).status_code,
                        (await http.post("/console/sign-in", data={"token": "forged"})).status_code]
    assert set(refused) <= {401, 403} and len(refused) == 100
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM audit_log"))).scalar() == 0
