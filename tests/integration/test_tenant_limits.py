"""Per-tenant limits as data, through the real gateway, scheduler and workers: run slots set per
tenant take effect with no restart (at creation, in admission rounds), an admin of one tenant may
lower its limits within the ceiling and never raise them past it, and every change is audited; a
tenant whose runs spent its token budget for the period gets no new admissions until the period rolls
over or an operator raises the budget, while another tenant's runs go on."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from tests.fixtures import eventually
from tests.integration.budget_kinds import NAP, TOKENS_PER_CALL
from tests.integration.ensemble import OPERATOR_TOKEN, Ensemble, publish_create, run_id_for, status_of
from tests.integration.identities import bearer

pytestmark = pytest.mark.integration

EVERY_TENANT = {"authorization": f"Bearer {OPERATOR_TOKEN}"}
KINDS = {"LONGRUN_RUN_KINDS": "tests.integration.budget_kinds:kinds"}


async def _admitted(engine, tenant: str) -> int:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT count(*) FROM runs WHERE tenant_id = :t AND admitted_at IS NOT NULL"),
                                   {"t": tenant})).scalar_one()


async def _all_created(engine) -> bool:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT count(*) FROM runs"))).scalar_one() == 8


async def _limits(http: httpx.AsyncClient, tenant: str, headers: dict[str, str], **limits: Any) -> httpx.Response:
    return await http.put(f"/tenants/{tenant}/limits", headers=headers, json={**limits, "reason": "capacity"})


async def _steady(engine, tenant: str, n: int, *, for_seconds: float = 1.5) -> None:  # type: ignore[no-untyped-def]
    """The tenant's admitted runs are ``n`` and stay ``n`` (admission rounds run twice a second)."""
    await eventually(lambda: _is(engine, tenant, n), timeout=15, what=f"{n} of {tenant}'s runs admitted")
    deadline = time.monotonic() + for_seconds
    while time.monotonic() < deadline:
        assert await _admitted(engine, tenant) == n
        await asyncio.sleep(0.1)


async def _is(engine, tenant: str, n: int) -> bool:  # type: ignore[no-untyped-def]
    return await _admitted(engine, tenant) == n


@pytest.fixture
async def ensemble(clean, services, tmp_path):  # type: ignore[no-untyped-def]
    return Ensemble(services, tmp_path)


async def test_tenant_slots_set_through_the_api_hold_at_once_within_the_ceiling(
        engine, bus, ensemble) -> None:
    # Given a gateway and a scheduler whose platform default is 1 slot per tenant, and no worker
    ensemble.start_services("gateway", "scheduler", LONGRUN_TENANT_SLOTS="1", **KINDS)
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        shown = (await http.get("/tenants/acme/limits", headers=EVERY_TENANT)).json()
        assert shown["version"] is None and shown["run_slots"] is None and shown["use"] is None
        assert shown["in_force"] == {"run_slots": 1, "token_budget": None, "cost_budget": None,
                                     "tool_concurrency": {}}
        # When an admin of every tenant gives acme 3 slots
        answer = await _limits(http, "acme", EVERY_TENANT, run_slots=3, tool_concurrency={"forge.*": 2})
        assert answer.status_code == 200, answer.text
        assert answer.json()["version"] == 1 and answer.json()["in_force"]["run_slots"] == 3
        # and 5 runs of acme and 3 of beta are asked for
        for i in range(5):
            await publish_create(bus, tenant="acme", key=f"a-{i}", input_={}, workflow="thinker")
        for i in range(3):
            await publish_create(bus, tenant="beta", key=f"b-{i}", input_={}, workflow="thinker")
        await eventually(lambda: _all_created(engine), timeout=30, what="every run created")
        # Then acme holds its 3 slots, beta the platform's 1
        await _steady(engine, "acme", 3)
        assert await _admitted(engine, "beta") == 1
        # When acme's own admin lowers its slots to 2 (its limits whole, as every change states them): allowed
        tia = await bearer(engine, "tia", "admin", tenants=("acme",))
        forge = {"forge.*": 2}
        lowered = await _limits(http, "acme", tia, run_slots=2, tool_concurrency=forge)
        assert lowered.status_code == 200, lowered.text
        # and the 3 runs admitted keep their slots
        assert await _admitted(engine, "acme") == 3
        # but leaving a tool group unbounded is widening it, and refused
        unbounded = await _limits(http, "acme", tia, run_slots=2)
        assert unbounded.status_code == 403 and "tool_concurrency" in unbounded.json()["error"]
        # and so is raising the slots again past what is in force, naming both values; nothing changes
        refused = await _limits(http, "acme", tia, run_slots=5, tool_concurrency=forge)
        assert refused.status_code == 403
        assert "run_slots 5 go beyond the ceiling's 2" in refused.json()["error"]
        assert (await http.get("/tenants/acme/limits", headers=tia)).json()["run_slots"] == 2
        # and so is a budget left unlimited under a ceiling that bounds it
        ceiling = await http.put("/tenants/acme/limits/ceiling", headers=EVERY_TENANT,
                                 json={"run_slots": 5, "token_budget": 10000, "reason": "contract"})
        assert ceiling.status_code == 200, ceiling.text
        assert ceiling.json()["origins"]["run_slots"] == "set by an admin of every tenant"
        # token budget unlimited:
        assert (await _limits(http, "acme", tia, run_slots=5, tool_concurrency=forge)).status_code == 403
        # When acme's admin raises its slots to the new ceiling, with a budget within it
        raised = await _limits(http, "acme", tia, run_slots=5, token_budget=10000, tool_concurrency=forge)
        assert raised.status_code == 200, raised.text
        # Then every acme run is admitted, without any restart
        await _steady(engine, "acme", 5, for_seconds=0.5)
        assert await _admitted(engine, "beta") == 1
        # and the policy's ceiling, set since, keeps the limits' ceiling
        assert (await http.put("/tenants/acme/ceiling", headers=EVERY_TENANT,
                               json={"tools": ["*"], "resources": ["*"], "reason": "r"})).status_code == 200
        assert (await http.get("/tenants/acme/limits", headers=tia)).json()["ceiling"]["run_slots"] == 5
        # and a ceiling lifted (null) bounds nothing: acme's admin may leave its tool groups unbounded
        lifted = await http.put("/tenants/acme/limits/ceiling", headers=EVERY_TENANT,
                                json={"tool_concurrency": None, "reason": "no tool bounds"})
        assert lifted.status_code == 200 and lifted.json()["tool_concurrency"] is None, lifted.text
        unbound = await _limits(http, "acme", tia, run_slots=5, token_budget=10000)
        assert unbound.status_code == 200, unbound.text
        # and who may see or change them is checked: a viewer may not change them, another tenant's admin
        # does not see them, a bad value is refused naming it
        viewer = await bearer(engine, "vic", "viewer", tenants=("acme",))
        assert (await _limits(http, "acme", viewer, run_slots=1)).status_code == 403
        gil = await bearer(engine, "gil", "admin", tenants=("beta",))
        assert (await http.get("/tenants/acme/limits", headers=gil)).status_code == 404
        assert (await _limits(http, "acme", gil, run_slots=1)).status_code == 404
        assert (await http.put("/tenants/acme/limits/ceiling", headers=tia,
                               json={"run_slots": 50, "reason": "r"})).status_code == 403
        bad = await _limits(http, "acme", EVERY_TENANT, run_slots=-1, tool_concurrency={"forge.*": 0})
        assert bad.status_code == 422 and "run_slots" in bad.text and "tool_concurrency" in bad.text
    async with engine.connect() as conn:
        audited = [tuple(r) for r in await conn.execute(text(
            "SELECT actor, action, target FROM audit_log WHERE action LIKE 'tenant_limits%' ORDER BY id"))]
    assert audited == [("bootstrap", "tenant_limits.set", "acme"), ("tia", "tenant_limits.set", "acme"),
                       ("bootstrap", "tenant_limits_ceiling.set", "acme"), ("tia", "tenant_limits.set", "acme"),
                       ("bootstrap", "tenant_limits_ceiling.set", "acme"), ("tia", "tenant_limits.set", "acme")]


async def _spent(engine, tenant: str) -> dict[str, Any] | None:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        row = (await conn.execute(text("SELECT tokens, spent, period_end FROM tenant_budget_use WHERE tenant_id = :t"),
                                  {"t": tenant})).first()
    return None if row is None else dict(row._mapping)


async def _finished(engine, tenant: str, key: str) -> str:  # type: ignore[no-untyped-def]
    run_id = await eventually(lambda: run_id_for(engine, tenant, key), timeout=30, what=f"{key} created")

    async def completed() -> bool:
        return await status_of(engine, run_id) == "COMPLETED"

    await eventually(completed, timeout=30, what=f"{key} completed")
    return str(run_id)


async def _admitted_at(engine, run_id: str) -> Any:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT admitted_at FROM runs WHERE run_id = :r"), {"r": run_id})).scalar()


@pytest.mark.long
async def test_a_tenant_over_its_token_budget_gets_no_admission_until_an_operator_raises_it(
        engine, bus, ensemble) -> None:
    # Given every service, and acme's budget of 2 model calls' tokens per day (beta has none)
    ensemble.start_services("gateway", "scheduler", "worker", "relay", **KINDS)
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        assert (await _limits(http, "acme", EVERY_TENANT, token_budget=2 * TOKENS_PER_CALL)).status_code == 200
        # When two of acme's runs, one after the other, each ask the model once
        for key in ("first", "second"):
            await publish_create(bus, tenant="acme", key=key, input_={}, workflow="thinker")
            await _finished(engine, "acme", key)
        # Then its period's use is both calls' tokens, and its budget is spent
        assert (await http.get("/tenants/acme/limits", headers=EVERY_TENANT)).json()["use"]["tokens"] == 500
        assert (await _spent(engine, "acme"))["spent"] is True  # type: ignore[index]
        # and a new run of acme stays queued while beta's run (no budget) is admitted and completes
        await publish_create(bus, tenant="acme", key="third", input_={}, workflow="thinker")
        await publish_create(bus, tenant="beta", key="other", input_={}, workflow="thinker")
        await _finished(engine, "beta", "other")
        third = await eventually(lambda: run_id_for(engine, "acme", "third"), what="the third run")
        await asyncio.sleep(1.5)
        assert await _admitted_at(engine, third) is None and await status_of(engine, third) == "READY"
        assert await _spent(engine, "beta") is None  # a tenant without a budget writes no use
        # When an operator raises acme's budget
        assert (await _limits(http, "acme", EVERY_TENANT, token_budget=10 * TOKENS_PER_CALL)).status_code == 200
        # Then the queued run is admitted and completes, and the period's use goes on from where it was
        await _finished(engine, "acme", "third")
        use = (await http.get("/tenants/acme/limits", headers=EVERY_TENANT)).json()["use"]
        assert use["tokens"] == 750 and use["spent"] is False


@pytest.mark.long
async def test_a_tenant_over_its_default_token_budget_is_admitted_again_when_the_period_rolls_over(
        engine, bus, ensemble) -> None:
    # Given every service, with periods of 6 s and a platform default budget of one model call's tokens
    period = 6
    ensemble.start_services("gateway", "scheduler", "worker", "relay", "timer",
                            LONGRUN_TENANT_BUDGET_PERIOD=f"{period}s",
                            LONGRUN_TENANT_TOKEN_BUDGET=str(TOKENS_PER_CALL), **KINDS)
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    await asyncio.sleep(period - time.time() % period + 0.1)  # a period starts
    # When a run of acme spends the budget, naps and is about to ask the model again
    await publish_create(bus, tenant="acme", key="first", input_={}, workflow="napper")
    first = await eventually(lambda: run_id_for(engine, "acme", "first"), what="the first run")

    async def spent_by_first() -> dict[str, Any] | None:
        use = await _spent(engine, "acme")
        return use if use is not None and use["spent"] else None

    spent = await eventually(spent_by_first, timeout=15, what="acme's budget spent")
    assert spent["tokens"] == TOKENS_PER_CALL
    # and another is asked for in the same period
    await publish_create(bus, tenant="acme", key="second", input_={}, workflow="thinker")
    second = await eventually(lambda: run_id_for(engine, "acme", "second"), what="the second run")
    async with engine.connect() as conn:
        created = (await conn.execute(text("SELECT created_at FROM runs WHERE run_id = :r"), {"r": second})).scalar()
    assert created < spent["period_end"]
    # Then the first waits for the budget, and the second is not admitted
    async def parked() -> bool:
        return (await _wait_of(engine, first))[1] == "tenant_budget"

    await eventually(parked, timeout=NAP + 3, what="the first run parked for the budget")
    assert await _admitted_at(engine, second) is None
    # until the period rolls over: then both complete, the first asking the model again only then
    await _finished(engine, "acme", "first")
    await _finished(engine, "acme", "second")
    assert await _admitted_at(engine, second) >= spent["period_end"]
    async with engine.connect() as conn:
        asked_again = (await conn.execute(text(
            "SELECT min(e.occurred_at) FROM run_events AS e WHERE e.run_id = :r AND e.type = 'fact.recorded' "
            "AND e.data ->> 'key' = 'proposal:again:1'"), {"r": first})).scalar()
    assert asked_again >= spent["period_end"]


async def _wait_of(engine, run_id: str) -> tuple[str, str | None, str | None]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        row = (await conn.execute(text("SELECT status, wait_kind, wait_correlation_key FROM runs WHERE run_id = :r"),
                                  {"r": run_id})).one()
    return row.status, row.wait_kind, row.wait_correlation_key


async def _asked(engine, run_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return list((await conn.execute(text(
            "SELECT data ->> 'key' FROM run_events WHERE run_id = :r AND type = 'fact.recorded' "
            "AND data ->> 'key' LIKE 'proposal:%' ORDER BY seq"), {"r": run_id})).scalars())


@pytest.mark.long
async def test_a_run_about_to_ask_the_model_while_its_tenant_is_out_of_budget_waits_until_a_raise(
        engine, bus, ensemble) -> None:
    # Given every service, and acme's budget of one model call's tokens per day
    ensemble.start_services("gateway", "scheduler", "worker", "relay", "timer", **KINDS)
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        assert (await _limits(http, "acme", EVERY_TENANT, token_budget=TOKENS_PER_CALL)).status_code == 200
        # When a run asks the model (spending the budget), naps, and is about to ask again
        await publish_create(bus, tenant="acme", key="napper", input_={}, workflow="napper")
        run_id = await eventually(lambda: run_id_for(engine, "acme", "napper"), timeout=30, what="the run")

        async def parked() -> bool:
            return await _wait_of(engine, run_id) == ("RETRY_SCHEDULED", "tenant_budget", "tenant_budget:acme")

        # Then it parks, waiting for its tenant's budget, without asking the model a second time
        await eventually(parked, timeout=NAP + 15, what="the run parked for acme's budget")
        await asyncio.sleep(1.0)
        assert await parked() and await _asked(engine, run_id) == ["proposal:think:1"]
        assert (await http.get("/tenants/acme/limits", headers=EVERY_TENANT)).json()["use"]["tokens"] == 250
        # When an operator raises the budget, Then the run is woken at once, asks again and completes
        assert (await _limits(http, "acme", EVERY_TENANT, token_budget=4 * TOKENS_PER_CALL)).status_code == 200

        async def completed() -> bool:
            return await status_of(engine, run_id) == "COMPLETED"

        await eventually(completed, timeout=15, what="the run completed after the raise")
        assert await _asked(engine, run_id) == ["proposal:think:1", "proposal:again:1"]
        assert (await http.get("/tenants/acme/limits", headers=EVERY_TENANT)).json()["use"]["tokens"] == 500
