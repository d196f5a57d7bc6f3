"""Child runs through the real services (scheduler, worker, relay, timer, gateway): a ``parent`` run
(``tests/integration/child_kinds.py``) starts ``leaf`` children, waits for them holding no tenant slot,
and completes with their outcomes; cancelling it cancels its children; their budgets are drawn from
its own; a child's failure is a fact it reads; with fewer tenant slots than parents waiting on
children, every parent completes."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.bus import topology
from longrun.bus.codec import broker_user, to_message
from longrun.bus.connection import Bus
from longrun.envelope import make
from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, event_types, new_key, run_id_for, status_of
from tests.integration.identities import bearer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TENANT = "acme"


async def _create(bus: Bus, engine: AsyncEngine, goal: dict[str, Any], *,
                  budget: dict[str, Any] | None = None) -> str:
    key = new_key()
    payload = {"workflow": "parent", "idempotency_key": key, "input": goal, "priority": 5}
    if budget is not None:
        payload["budget"] = budget
    envelope = make("run.create", payload, producer="tests", tenant_id=TENANT)
    await bus.publish(topology.INGRESS_EXCHANGE, "run.create", to_message(envelope, user_id=broker_user(bus.url)))
    return str(await eventually(lambda: run_id_for(engine, TENANT, key), what="the parent run"))


async def _children(engine: AsyncEngine, parent: str) -> dict[str, tuple[str, str]]:
    """Each child of ``parent`` by name: (run id, status)."""
    async with engine.connect() as conn:
        rows = await conn.execute(text(
            "SELECT c.name, c.child_run_id, r.status FROM children c JOIN runs r ON r.run_id = c.child_run_id "
            "WHERE c.parent_run_id = :p"), {"p": parent})
        return {r.name: (r.child_run_id, r.status) for r in rows}


async def _ends(engine: AsyncEngine, run_id: str, status: str, timeout: float = 40) -> None:
    async def ended() -> bool:
        return await status_of(engine, run_id) == status
    await eventually(ended, timeout=timeout, what=f"{run_id} {status}")


async def _evidence(engine: AsyncEngine, run_id: str) -> dict[str, Any]:
    completed = [data for type_, data in await event_types(engine, run_id) if type_ == "run.completed"]
    assert len(completed) == 1
    return completed[0]["evidence"]  # type: ignore[no-any-return]


@pytest.fixture
async def ensemble(clean, engine, bus, services, tmp_path):  # type: ignore[no-untyped-def]
    ensemble = Ensemble(services, tmp_path)
    ensemble.env.update({"LONGRUN_RUN_KINDS": "tests.integration.child_kinds:kinds", "LONGRUN_TENANT_SLOTS": "2"})
    ensemble.start_services("gateway", "scheduler", "worker", "relay", "timer")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    return ensemble


async def test_a_parent_with_ten_children_completes_with_their_outcomes(ensemble, engine, bus) -> None:  # type: ignore[no-untyped-def]
    parent = await _create(bus, engine, {"children": 10, "leaf": {"mode": "complete", "value": 7}})
    await _ends(engine, parent, "COMPLETED")
    kids = await _children(engine, parent)
    assert sorted(kids) == sorted(f"c{i}" for i in range(10))
    assert {status for _, status in kids.values()} == {"COMPLETED"}
    outcomes = (await _evidence(engine, parent))["children"]
    assert outcomes == {name: {"run_id": run_id, "status": "COMPLETED", "evidence": {"value": 7},
                                "reason": "acceptance check passed"}
                        for name, (run_id, _) in kids.items()}
    timeline = [type_ for type_, _ in await event_types(engine, parent)]
    assert timeline.count("run.child_started") == 10 and timeline.count("run.child_ended") == 10
    # Started in one step, before the wait; each end recorded once, the wait ended by the tenth.
    assert timeline.index("run.wait_started") > max(i for i, t in enumerate(timeline) if t == "run.child_started")
    assert timeline.index("run.completed") > max(i for i, t in enumerate(timeline) if t == "run.child_ended")
    # An operator's view of the parent lists its children by name; a child's names its parent.
    ops = await bearer(engine, "ops", "viewer")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, headers=ops, timeout=10) as http:
        view = (await http.get(f"/runs/{parent}")).json()
        assert view["parent"] is None
        assert view["children"] == [{"name": name, "run_id": kids[name][0], "status": "COMPLETED"} for name in sorted(kids)]
        child = (await http.get(f"/runs/{kids['c3'][0]}")).json()
        assert child["parent"] == {"run_id": parent, "name": "c3"} and child["children"] == []


async def test_a_childs_failure_is_a_fact_the_parent_decides_on(ensemble, engine, bus) -> None:  # type: ignore[no-untyped-def]
    parent = await _create(bus, engine, {"children": 2, "leaf": {"mode": "fail"}})
    await _ends(engine, parent, "COMPLETED")
    outcomes = (await _evidence(engine, parent))["children"]
    assert {o["status"] for o in outcomes.values()} == {"FAILED"}
    assert {o["reason"] for o in outcomes.values()} == {"the leaf was told to fail"}


async def test_cancelling_the_parent_cancels_its_children(ensemble, engine, bus) -> None:  # type: ignore[no-untyped-def]
    # Two children fill the tenant's two slots while they wait; their parent waits holding none.
    parent = await _create(bus, engine, {"children": 2, "leaf": {"mode": "wait"}})

    async def waiting() -> bool:
        kids = await _children(engine, parent)
        return len(kids) == 2 and {s for _, s in kids.values()} == {"WAITING_EVENT"} \
            and await status_of(engine, parent) == "WAITING_EVENT"
    await eventually(waiting, timeout=30, what="the parent and its children waiting")
    ops = await bearer(engine, "ops", "operator")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        answer = await http.post(f"/runs/{parent}/cancel", headers=ops, json={"reason": "not needed"})
        assert answer.status_code == 200, answer.text
    await _ends(engine, parent, "CANCELLED")
    for run_id, _ in (await _children(engine, parent)).values():
        await _ends(engine, run_id, "CANCELLED")
    # Each child's end reached the parent once (applied while it was cancelling, kept late after it ended).
    async def told() -> bool:
        return [t for t, _ in await event_types(engine, parent)].count("run.child_ended") == 2
    await eventually(told, timeout=10, what="both ends told to the parent")


async def test_an_abandoned_child_runs_on_when_its_parent_is_cancelled(ensemble, engine, bus) -> None:  # type: ignore[no-untyped-def]
    parent = await _create(bus, engine, {"children": 1, "leaf": {"mode": "wait"}, "on_parent_cancel": "abandon"})

    async def waiting() -> bool:
        kids = await _children(engine, parent)
        return len(kids) == 1 and await status_of(engine, parent) == "WAITING_EVENT"
    await eventually(waiting, timeout=30, what="the parent waiting")
    ops = await bearer(engine, "ops", "operator")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        assert (await http.post(f"/runs/{parent}/cancel", headers=ops, json={"reason": "x"})).status_code == 200
    await _ends(engine, parent, "CANCELLED")
    [(child, status)] = (await _children(engine, parent)).values()
    assert status == "WAITING_EVENT" and await status_of(engine, child) == "WAITING_EVENT"


async def test_children_draw_their_budget_from_the_parents_tree(ensemble, engine, bus) -> None:  # type: ignore[no-untyped-def]
    # The parent may make 3 model calls; each of its 4 children asks for 1 and spends 1: the first three
    # get theirs, the fourth gets none and ends BUDGET_EXHAUSTED. The tree spent 3, never more.
    parent = await _create(bus, engine, {"children": 4, "leaf": {"mode": "think"},
                                         "child_budget": {"model_calls": 1, "tool_calls": 5, "cost": 1.0}},
                           budget={"model_calls": 3, "tool_calls": 20, "cost_usd": 10.0})
    await _ends(engine, parent, "COMPLETED")
    outcomes = (await _evidence(engine, parent))["children"]
    assert sorted(o["status"] for o in outcomes.values()) == ["BUDGET_EXHAUSTED", "COMPLETED", "COMPLETED",
                                                             "COMPLETED"]
    drawn = [data["budget"]["model_calls"] for type_, data in await event_types(engine, parent)
             if type_ == "run.child_started"]
    assert drawn == [1, 1, 1, 0]
    async with engine.connect() as conn:
        spent = (await conn.execute(text(
            "SELECT sum((snapshot #>> '{budget,used,model_calls}')::int) FROM runs WHERE run_id IN "
            "(SELECT child_run_id FROM children WHERE parent_run_id = :p)"), {"p": parent})).scalar()
        parent_used = (await conn.execute(text(
            "SELECT (snapshot #>> '{budget,used,model_calls}')::int FROM runs WHERE run_id = :p"),
            {"p": parent})).scalar()
    assert spent == 3
    assert parent_used == 3  # what its children spent, charged to it; nothing unspent kept from it


async def test_parents_waiting_on_children_hold_no_slot(ensemble, engine, bus) -> None:  # type: ignore[no-untyped-def]
    # Two slots, four parents of two children each: parents holding their slots while they wait would
    # leave their children queued for ever.
    parents = [await _create(bus, engine, {"children": 2, "leaf": {"mode": "complete"}}) for _ in range(4)]
    for parent in parents:
        await _ends(engine, parent, "COMPLETED", timeout=60)
    for parent in parents:
        kids = await _children(engine, parent)
        assert {s for _, s in kids.values()} == {"COMPLETED"} and len(kids) == 2
