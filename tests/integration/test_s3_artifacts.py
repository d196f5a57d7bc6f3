"""Artifacts in a real S3-compatible server (``tests/integration/s3_server.py``) through the real services:
a tool's 5 MB answer is a claim check (the bytes under the tenant's prefix, the run's history holding
their hash), the gateway serves them back with its security headers, and server-side encryption is
asked for on every put."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest
from sqlalchemy import text

from longrun.s3_artifacts import S3ArtifactStore
from tests.fixtures import eventually
from tests.integration.bulky_kinds import receipt_body
from tests.integration.ensemble import Ensemble, event_types, new_key, publish_create, run_id_for, status_of
from tests.integration.identities import bearer
from tests.integration.s3_server import S3Server, new_prefix

pytestmark = pytest.mark.integration

MEGABYTES = 5


async def test_a_tools_5_mb_answer_is_kept_in_s3_under_the_tenant_and_the_history_holds_its_hash(
        clean, engine, bus, services, tmp_path, s3_server: S3Server) -> None:
    # Given the services storing artifacts in S3, and a run whose tool answers with a 5 MB log
    prefix = new_prefix()
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_services("scheduler", "worker", "relay", "gateway",
                            LONGRUN_RUN_KINDS="tests.integration.bulky_kinds:kinds", **s3_server.environment(prefix))
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_={"seed": key, "megabytes": MEGABYTES}, workflow="bulky")
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")

    # When it runs
    async def completed() -> bool:
        return await status_of(engine, run_id) == "COMPLETED"

    await eventually(completed, timeout=90, what=f"{run_id} COMPLETED")

    # Then the answer's bytes are in the bucket under the tenant's prefix, and nowhere else
    body = receipt_body(key, MEGABYTES)
    assert len(body) > MEGABYTES * 1024 * 1024
    content_hash = hashlib.sha256(body).hexdigest()
    object_key = f"tenants/acme/{content_hash[:2]}/{content_hash}"
    assert await S3ArtifactStore(s3_server.location(prefix)).get("acme", content_hash) == body
    assert await s3_server.entry(f"{prefix}/{object_key}") is not None
    assert await s3_server.entry(f"{prefix}/tenants/globex/{content_hash[:2]}/{content_hash}") is None
    # and the run's history holds the hash, not the bytes
    history = await event_types(engine, run_id)
    [recorded] = [data for kind, data in history if kind == "action.recorded"]
    assert recorded["receipt_ref"] == content_hash
    assert recorded["receipt"]["artifact"] == content_hash and "log" not in recorded["receipt"]
    assert len(json.dumps(history)) < 64 * 1024
    # and the reference is registered for the tenant, its upload no longer in flight
    async with engine.connect() as conn:
        registered = (await conn.execute(text(
            "SELECT tenant_id, run_id, size_bytes, location FROM artifacts WHERE content_hash = :h"),
            {"h": content_hash})).all()
        in_flight = (await conn.execute(text("SELECT count(*) FROM artifact_uploads"))).scalar()
    assert [tuple(r) for r in registered] == [("acme", run_id, len(body), f"s3://longrun-tests/{prefix}/{object_key}")]
    assert in_flight == 0

    # When an operator fetches it through the gateway
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    headers = await bearer(engine, "ana", "admin")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=30) as gateway:
        served = await gateway.get(f"/runs/{run_id}/artifacts/{content_hash}", headers=headers)
    # Then the gateway passes the bytes through as an attachment nothing in a browser may run
    assert (served.status_code, served.content) == (200, body)
    assert served.headers["content-type"] == "application/json"
    assert served.headers["content-disposition"] == f'attachment; filename="{content_hash}"'
    assert served.headers["x-content-type-options"] == "nosniff"
    assert served.headers["content-security-policy"].startswith("default-src 'none'; sandbox")


async def test_objects_put_with_sse_s3_are_encrypted_at_rest(s3_server: S3Server) -> None:
    # Given a store asking for SSE-S3 on every put
    prefix = new_prefix()
    store = S3ArtifactStore(s3_server.location(prefix, encryption="AES256"))
    data = b"a diff with a customer's address in it\n" * 100
    # When it stores an object
    content_hash = await store.put("acme", data)
    # Then the server kept it encrypted (its record says so, its volumes hold other bytes), and it
    # reads back whole
    key = f"{prefix}/tenants/acme/{content_hash[:2]}/{content_hash}"
    entry = await s3_server.entry(key)
    assert entry is not None and "X-Amz-Server-Side-Encryption" in entry["Extended"]
    assert data not in await s3_server.stored_bytes(key)
    assert await store.get("acme", content_hash) == data


async def test_a_put_asks_for_sse_kms_with_the_configured_key(s3_server: S3Server) -> None:
    # Given a store asking for SSE-KMS, and a server with no KMS
    store = S3ArtifactStore(s3_server.location(new_prefix(), encryption="aws:kms", kms_key_id="longrun-artifacts"))
    # When it stores an object, then the server refuses to store it unencrypted
    with pytest.raises(Exception, match="Internal"):
        await store.put("acme", b"must not be stored in the clear")
