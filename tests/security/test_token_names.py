"""A live token's name belongs to one holder, and a decision records the credential it was made with."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from longrun.db import migrate
from tests.integration.ensemble import OPERATOR_TOKEN, Ensemble
from tests.integration.identities import token
from tests.integration.runs_factory import waiting_for_user

pytestmark = pytest.mark.integration


@pytest.fixture
async def gateway(services, tmp_path):  # type: ignore[no-untyped-def]
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        yield http


async def test_no_one_mints_a_token_named_like_an_approvals_owner_who_holds_one(clean, engine, gateway) -> None:
    # Given user_42 holds a live token and owns an approval
    owner_secret = await token(engine, "user_42")
    stored = await waiting_for_user(engine, approval_id="ap-1", approved_hash="h1")
    admin = {"authorization": f"Bearer {OPERATOR_TOKEN}"}
    # When an admin mints another token named user_42
    minted = await gateway.post("/tokens", headers=admin, json={
        "name": "user_42", "roles": ["approver"], "tenants": None, "reason": "impersonate"})
    # Then it is refused, and the owner's own token decides, recording which token it was
    assert minted.status_code == 409 and "a live token is named 'user_42' already" in minted.json()["error"]
    decided = await gateway.post(f"/runs/{stored.snapshot.run_id}/approve", headers={
        "authorization": f"Bearer {owner_secret}"}, json={"approval_id": "ap-1", "approved_hash": "h1",
                                                          "reason": "reviewed"})
    assert decided.status_code == 200
    async with engine.connect() as conn:
        token_id = (await conn.execute(text("SELECT id FROM operator_tokens WHERE name = 'user_42'"))).scalar()
        details = (await conn.execute(text("SELECT details FROM audit_log WHERE action = 'approve'"))).scalar()
    assert details["credential"] == f"token:{token_id}"


def test_an_upgrade_over_live_tokens_sharing_a_name_stops_naming_them(infra) -> None:  # type: ignore[no-untyped-def]
    name = f"lrs_{uuid.uuid4().hex[:10]}"
    url = make_url(infra.database_url).set(database=name).render_as_string(hide_password=False)
    migrate.create_database(url)
    engine = create_engine(url)
    try:
        migrate.upgrade(url, "0026")
        with engine.begin() as conn:
            for holder in ("ana", "ana", "ben", "ana"):
                conn.execute(text("INSERT INTO operator_tokens (name, secret_sha256, roles, created_by) "
                                  "VALUES (:n, md5(random()::text), '[\"viewer\"]', 'tests')"), {"n": holder})
        with pytest.raises(RuntimeError, match=r"'ana' \(tokens 1, 2, 4\)"):
            migrate.upgrade(url, "0027")
        with engine.begin() as conn:
            conn.execute(text("UPDATE operator_tokens SET revoked_at = now() WHERE id IN (1, 2)"))
        migrate.upgrade(url, "0027")
        assert migrate.current_revision(url) == "0027"
    finally:
        engine.dispose()
        admin = create_engine(make_url(infra.database_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


async def test_a_token_with_an_expiry_is_refused_once_it_passes(clean, gateway) -> None:
    admin = {"authorization": f"Bearer {OPERATOR_TOKEN}"}
    request = {"name": "temp-ana", "roles": ["viewer"], "tenants": ["acme"], "reason": "an hour of help"}
    assert (await gateway.post("/tokens", headers=admin, json={**request, "expires_in": "soon"})).status_code == 422
    created = await gateway.post("/tokens", headers=admin, json={**request, "expires_in": "2s"})
    assert created.status_code == 200 and created.json()["token"]["expires_at"] is not None
    temporary = {"authorization": f"Bearer {created.json()['secret']}"}
    assert (await gateway.get("/me", headers=temporary)).status_code == 200
    await asyncio.sleep(2.5)
    assert (await gateway.get("/me", headers=temporary)).status_code == 401
