"""A platform ceiling, a tenant floor: through the real gateway, an admin of one tenant narrows its
tenant's policy (200) and cannot widen it past the ceiling (403, nothing written), with a ceiling an
admin of every tenant set and without one (then the policy in force, or the kinds' maximum, holds);
and the migration that brought ceilings records each policy in force as its tenant's ceiling."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from longrun.db import migrate
from tests.integration.ensemble import OPERATOR_TOKEN, Ensemble
from tests.integration.identities import bearer
from tests.integration.test_schema import scratch_url  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

EVERY_TENANT = {"authorization": f"Bearer {OPERATOR_TOKEN}"}
EVERYTHING = {"tools": ["*"], "resources": ["*"]}
ACME = {"tools": ["forge.*"], "resources": ["repo:acme/*"]}


@pytest.fixture
async def gateway(clean, services, tmp_path):  # type: ignore[no-untyped-def]
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        yield http


async def put(http: httpx.AsyncClient, path: str, headers: dict[str, str], scope: dict[str, list[str]],
              reason: str = "r") -> httpx.Response:
    return await http.put(path, headers=headers, json={**scope, "reason": reason})


async def policy(http: httpx.AsyncClient, tenant: str) -> dict[str, Any]:
    answer = await http.get(f"/tenants/{tenant}/policy", headers=EVERY_TENANT)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def audit(engine) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return [tuple(r) for r in await conn.execute(  # type: ignore[misc]
            text("SELECT actor, action, target FROM audit_log ORDER BY id"))]


async def test_without_a_ceiling_a_tenants_admin_narrows_the_policy_in_force_and_cannot_widen_it(
        engine, gateway) -> None:
    # Given acme's policy, set by an admin of every tenant, and no ceiling
    assert (await put(gateway, "/tenants/acme/policy", EVERY_TENANT, ACME)).status_code == 200
    tia = await bearer(engine, "tia", "admin", tenants=("acme",))
    held = (await gateway.get("/tenants/acme/ceiling", headers=tia)).json()
    assert held == {"tenant_id": "acme", "version": None, **ACME,
                    "origins": {"tools": "the value in force: no ceiling is set",
                                "resources": "the value in force: no ceiling is set"}}
    # When acme's own admin narrows it: 200, a new version
    narrower = {"tools": ["forge.open_merge_request"], "resources": ["repo:acme/web"]}
    narrowed = await put(gateway, "/tenants/acme/policy", tia, narrower, reason="web only")
    assert narrowed.status_code == 200 and narrowed.json() == {"tenant_id": "acme", "version": 2, **narrower}
    # Then widening it (to everything, or back to what an admin of every tenant gave) is 403 and changes nothing
    for wider in (EVERYTHING, ACME):
        refused = await put(gateway, "/tenants/acme/policy", tia, wider, reason="wider")
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"].startswith(
            "tia may only narrow the policy of tenant 'acme' within its ceiling; tenant 'acme': tools "
            f"{wider['tools']} go beyond the ceiling's ['forge.open_merge_request'] (the value in force: no "
            "ceiling is set)"), refused.text
    assert await policy(gateway, "acme") == {"tenant_id": "acme", "version": 2, **narrower}
    assert await audit(engine) == [("bootstrap", "tenant_policy.set", "acme"), ("tia", "tenant_policy.set", "acme")]
    # A tenant with neither policy nor ceiling: the kinds' maximum holds, so its admin may set any narrowing
    gil = await bearer(engine, "gil", "admin", tenants=("globex",))
    assert (await gateway.get("/tenants/globex/ceiling", headers=gil)).json()["origins"] == {
        "tools": "the kinds' maximum: no ceiling or value is set",
        "resources": "the kinds' maximum: no ceiling or value is set"}
    assert (await put(gateway, "/tenants/globex/policy", gil, {"tools": ["forge.*"], "resources": ["*"]})
            ).status_code == 200
    assert (await put(gateway, "/tenants/globex/policy", gil, EVERYTHING)).status_code == 403


async def test_with_a_ceiling_a_tenants_admin_moves_its_policy_within_it_and_never_past_it(engine, gateway) -> None:
    tia = await bearer(engine, "tia", "admin", tenants=("acme",))
    # An admin of one tenant cannot set a ceiling, not even its own tenant's
    refused = await put(gateway, "/tenants/acme/ceiling", tia, EVERYTHING)
    assert refused.status_code == 403 and "only a principal of every tenant may" in refused.json()["error"]
    # Given a ceiling set by an admin of every tenant, and a narrower policy
    ceiling = await put(gateway, "/tenants/acme/ceiling", EVERY_TENANT, ACME, reason="acme's contract")
    assert ceiling.status_code == 200 and ceiling.json() == {
        "tenant_id": "acme", "version": 1, **ACME, "origins": {"tools": "set by an admin of every tenant",
                                                              "resources": "set by an admin of every tenant"}}
    assert (await gateway.get("/tenants/acme/ceiling", headers=tia)).json() == ceiling.json()
    narrow = {"tools": ["forge.open_merge_request"], "resources": ["repo:acme/web"]}
    assert (await put(gateway, "/tenants/acme/policy", EVERY_TENANT, narrow)).status_code == 200
    # When acme's admin widens its policy within the ceiling: 200
    within = await put(gateway, "/tenants/acme/policy", tia, {"tools": ["forge.*"], "resources": ["repo:acme/*"]})
    assert within.status_code == 200 and within.json()["version"] == 2
    assert (await put(gateway, "/tenants/acme/policy", tia, narrow)).status_code == 200
    # Then past it: 403, naming both values, and nothing changes
    past = await put(gateway, "/tenants/acme/policy", tia, {"tools": ["forge.*"], "resources": ["repo:*"]})
    assert past.status_code == 403
    assert past.json()["error"] == (
        "tia may only narrow the policy of tenant 'acme' within its ceiling; tenant 'acme': resources ['repo:*'] "
        "go beyond the ceiling's ['repo:acme/*'] (set by an admin of every tenant, v1): 'repo:*' not within it")
    assert (await put(gateway, "/tenants/acme/policy", tia, EVERYTHING)).status_code == 403
    assert await policy(gateway, "acme") == {"tenant_id": "acme", "version": 3, **narrow}
    # An admin of every tenant is not bound by it; another tenant's admin does not see it
    assert (await put(gateway, "/tenants/acme/policy", EVERY_TENANT, EVERYTHING)).status_code == 200
    gil = await bearer(engine, "gil", "admin", tenants=("globex",))
    assert (await gateway.get("/tenants/acme/ceiling", headers=gil)).status_code == 404
    assert (await put(gateway, "/tenants/acme/policy", gil, narrow)).status_code == 404
    assert await audit(engine) == [("bootstrap", "tenant_ceiling.set", "acme"), ("bootstrap", "tenant_policy.set", "acme"),
                                   ("tia", "tenant_policy.set", "acme"), ("tia", "tenant_policy.set", "acme"),
                                   ("bootstrap", "tenant_policy.set", "acme")]


def test_the_migration_records_each_policy_in_force_as_its_tenants_ceiling(scratch_url: str) -> None:  # noqa: F811
    migrate.upgrade(scratch_url, "0025")
    engine = create_engine(scratch_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO tenant_policies (tenant_id, version, tools, resources, updated_by) "
                              "VALUES ('acme', 4, :tools, :resources, 'ana')"),
                         {"tools": json.dumps(ACME["tools"]), "resources": json.dumps(ACME["resources"])})
        migrate.upgrade(scratch_url, "0029")
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT tenant_id, version, limits FROM tenant_ceilings")).all()
    finally:
        engine.dispose()
    assert [tuple(r) for r in rows] == [("acme", 1, ACME)]
