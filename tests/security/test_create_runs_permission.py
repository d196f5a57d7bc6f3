"""Creating runs over HTTP (``POST /runs``) takes the create_runs permission, which stands beside the
roles: no role carries it, an admin's and the bootstrap token's included, and it opens only the tenants
its holder sees. Granted on a named token (by an admin of every tenant) or by an OIDC token's roles claim."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import text

from tests.integration.identities import bearer
from tests.security.test_identity import BOOTSTRAP, auth, gateway, issuer

pytestmark = pytest.mark.integration
__all__ = ["gateway", "issuer"]  # the live gateway taking the issuer's JWTs, as tests/security/test_identity.py runs it


def create(key: str, tenant: str = "acme") -> dict[str, Any]:
    return {"tenant_id": tenant, "schema_version": 4,
            "payload": {"workflow": "steps", "idempotency_key": key, "input": {"steps": 1}}}


async def post(gateway: httpx.AsyncClient, headers: dict[str, str], key: str, tenant: str = "acme") -> httpx.Response:
    return await gateway.post("/runs", json=create(key, tenant), headers={**headers, "idempotency-key": key})


async def runs_made(engine) -> int:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT count(*) FROM runs"))).scalar_one()


async def test_no_role_creates_runs_not_even_an_admin_of_every_tenant(engine, gateway) -> None:
    # Given a viewer, an operator, an approver and an admin of every tenant, and the bootstrap admin
    callers = {role: await bearer(engine, f"{role}-1", role) for role in ("viewer", "operator", "approver", "admin")}
    callers["bootstrap"] = BOOTSTRAP
    # When each POSTs a create, Then each is forbidden for want of the permission, and no run is made
    for who, headers in callers.items():
        answer = await post(gateway, headers, f"k-{who}")
        assert answer.status_code == 403 and "create_runs" in answer.json()["error"], (who, answer.text)
    assert await runs_made(engine) == 0


async def test_a_producer_of_one_tenant_creates_there_and_is_forbidden_in_another(engine, gateway) -> None:
    producer = await bearer(engine, "acme-bot", tenants=("acme",), permissions=("create_runs",))
    # Given a producer of acme, When it creates in acme, Then the run is made
    assert (await post(gateway, producer, "k-1")).status_code == 201
    # When it creates in globex, Then it is forbidden (tenant_not_allowed), audited, and nothing is made there
    refused = await post(gateway, producer, "k-2", tenant="globex")
    assert (refused.status_code, refused.json()["code"]) == (403, "tenant_not_allowed")
    async with engine.connect() as conn:
        tenants = (await conn.execute(text("SELECT tenant_id FROM runs"))).scalars().all()
        audited = (await conn.execute(text(
            "SELECT actor, target FROM audit_log WHERE action = 'run.create.refused'"))).all()
    assert tenants == ["acme"] and [tuple(r) for r in audited] == [("acme-bot", "globex")]
    # and, holding no role, it reads nothing
    assert (await gateway.get("/runs", headers=producer)).status_code == 403


async def test_an_admin_grants_the_permission_on_a_token_and_a_jwt_carries_it_in_its_roles_claim(
        engine, gateway, issuer) -> None:
    # When the bootstrap admin creates a token with the permission alone, Then it holds it and no role
    made = await gateway.post("/tokens", headers=BOOTSTRAP, json={
        "name": "ci-bot", "roles": [], "permissions": ["create_runs"], "tenants": ["acme"], "reason": "pipeline"})
    assert made.status_code == 200, made.text
    assert (made.json()["token"]["roles"], made.json()["token"]["permissions"]) == ([], ["create_runs"])
    me = (await gateway.get("/me", headers=auth(made.json()["secret"]))).json()
    assert (me["roles"], me["permissions"]) == ([], ["create_runs"])
    assert (await post(gateway, auth(made.json()["secret"]), "k-token")).status_code == 201
    # and a token with neither a role nor a permission, or an unknown permission, is refused
    for grants in ({"roles": []}, {"roles": [], "permissions": ["superpower"]}):
        refused = await gateway.post("/tokens", headers=BOOTSTRAP, json={
            "name": "nobody", "tenants": None, "reason": "test", **grants})
        assert refused.status_code == 422, (grants, refused.text)
    # When an identity provider's user has create_runs in its roles claim, Then it creates in its tenants
    keys, _ = issuer
    jwt = auth(keys.sign({"sub": "pipeline", "roles": ["create_runs"], "tenants": ["acme"]}))
    assert (await post(gateway, jwt, "k-jwt")).status_code == 201
    assert (await post(gateway, auth(keys.sign({"sub": "root", "roles": ["admin"], "tenants": "*"})),
                       "k-admin")).status_code == 403
