"""Permissions through the real services: a tool outside a run's scope is never called (counted at the
far side), a producer's run.create v3 narrows the scope and cannot widen it, a changed tenant policy
voids an approval when the run resumes, and a v3 deadline ends a run TIMED_OUT through the timer service.

The run kinds are ``tests/integration/notes_kinds.py``: their far side is a file with one line per
call that reached it.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import text

from longrun_client import ctl, timeline
from longrun.bus import topology
from longrun.bus.codec import broker_user, to_message
from longrun.envelope import make
from tests.fixtures import eventually
from tests.integration.ensemble import (OPERATOR_TOKEN, Ensemble, event_types, goal, new_key, publish_create,
                                        run_id_for, status_of)
from tests.integration.identities import bearer

pytestmark = pytest.mark.integration

KINDS = "tests.integration.notes_kinds:kinds"


def _start(services, tmp_path: Path, *names: str) -> tuple[Ensemble, Path]:  # type: ignore[no-untyped-def]
    calls = tmp_path / "far-side.jsonl"
    calls.touch()
    ensemble = Ensemble(services, tmp_path)
    modules = {"gateway": "longrun.services.gateway", "scheduler": "longrun.services.scheduler", "worker": "longrun.services.worker",
               "relay": "longrun.services.outbox_relay", "timer": "longrun.services.timer"}
    for name in names:
        ensemble.start(name, modules[name], LONGRUN_RUN_KINDS=KINDS, NOTES_CALLS=str(calls))
    return ensemble, calls


def _far_side(calls: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in calls.read_text().splitlines()]


async def _create(bus, tenant: str, goal: dict[str, Any], *, workflow: str = "notes",  # type: ignore[no-untyped-def]
                  **v3: Any) -> str:
    key = new_key()
    envelope = make("run.create", {"workflow": workflow, "idempotency_key": key, "input": goal, **v3},
                    producer="tests", tenant_id=tenant)
    assert envelope.schema_version == 4  # v3's fields, and no timeouts
    await bus.publish(topology.INGRESS_EXCHANGE, "run.create", to_message(envelope, user_id=broker_user(bus.url)))
    return key


async def _run_in(engine, tenant: str, key: str, status: str) -> str:  # type: ignore[no-untyped-def]
    run_id = await eventually(lambda: run_id_for(engine, tenant, key), what="the run")

    async def there() -> bool:
        return await status_of(engine, run_id) == status

    await eventually(there, timeout=30, what=f"{run_id} {status}")
    return str(run_id)


async def _events(engine, run_id: str, type_: str) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    return [data for kind, data in await event_types(engine, run_id) if kind == type_]


async def _actions(engine, run_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return list((await conn.execute(text("SELECT tool FROM actions WHERE run_id = :r ORDER BY tool"),
                                        {"r": run_id})).scalars())


async def _operator(ensemble: Ensemble, method: str, path: str, body: dict[str, Any],
                    auth: dict[str, str] | None = None) -> httpx.Response:
    """The call as ``auth`` (default: the bootstrap admin)."""
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url) as gateway:
        return await gateway.request(method, path, json=body,
                                     headers=auth or {"authorization": f"Bearer {OPERATOR_TOKEN}"})


async def test_a_tool_outside_the_scope_is_never_called_and_a_producer_cannot_widen_the_scope(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given the kind allows notes.read and notes.write only, and one producer asks for everything
    _, calls = _start(services, tmp_path, "scheduler", "relay", "worker")
    wide = await _create(bus, "acme", {"doc": "public/a", "calls": ["write", "delete"]},
                         scope={"tools": ["*"], "resources": ["*"]})
    # and another narrows its run to reading
    narrow = await _create(bus, "acme", {"doc": "public/b", "calls": ["write"]}, scope={"tools": ["notes.read"]})
    # When decide asks for notes.delete (outside the kind's maximum), resp. notes.write (outside the request)
    wide_run = await _run_in(engine, "acme", wide, "NEEDS_ATTENTION")
    narrow_run = await _run_in(engine, "acme", narrow, "NEEDS_ATTENTION")
    # Then the far side saw the one call in scope and nothing else
    assert [(c["tool"], c["doc"]) for c in _far_side(calls)] == [("notes.write", "public/a")]
    assert await _actions(engine, wide_run) == ["notes.write"] and await _actions(engine, narrow_run) == []
    # the producer's '*' did not widen the kind's maximum
    created = (await _events(engine, wide_run, "run.created"))[0]
    assert created["permissions"] == {"tools": ["notes.read", "notes.write"], "resources": ["doc:*"],
                                      "policy_version": None}
    assert (await _events(engine, narrow_run, "run.created"))[0]["permissions"]["tools"] == ["notes.read"]
    # and the timeline names the refused tool and the scope, then NEEDS_ATTENTION with the same reason
    for run_id, tool, verb, scope in ((wide_run, "notes.delete", "delete:1", "['notes.read', 'notes.write']"),
                                      (narrow_run, "notes.write", "write:0", "['notes.read']")):
        recorded = [(kind, data) for kind, data in await event_types(engine, run_id)
                    if kind in ("run.permission_denied", "run.status_changed", "action.prepared")]
        denied = [data for kind, data in recorded if kind == "run.permission_denied"]
        assert [(d["tool"], d["logical_action"], d["resource"]) for d in denied] == [
            (tool, verb, f"doc:{'public/a' if run_id == wide_run else 'public/b'}")]
        assert f"tool {tool!r} is outside the run's scope (tools {scope}" in denied[0]["reason"]
        shown = timeline.describe(2, "run.permission_denied", denied[0], True, datetime.now(UTC))
        assert f"DENIED    {verb:<14} tool {tool!r} is outside" in shown
        assert recorded[-1][0] == "run.status_changed" and recorded[-1][1]["to"] == "NEEDS_ATTENTION"
        assert recorded[-1][1]["reason"] == f"permission denied: {denied[0]['reason']}"
        assert not any(kind == "action.prepared" and data["tool"] == tool for kind, data in recorded)


async def test_a_tenant_policy_narrows_new_runs_and_a_change_voids_an_approval_on_resume(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given tenant acme2 allows notes.* on public documents (policy v1)
    ensemble, calls = _start(services, tmp_path, "gateway", "scheduler", "relay", "worker")
    set_v1 = await _operator(ensemble, "PUT", "/tenants/acme2/policy",
                             {"tools": ["notes.*"], "resources": ["doc:public/*"], "reason": "onboarding"})
    assert set_v1.status_code == 200 and set_v1.json()["version"] == 1, set_v1.text
    # a run on a secret document is refused by the policy, whatever its kind allows
    secret = await _run_in(engine, "acme2", await _create(bus, "acme2", {"doc": "secret/x", "calls": ["write"]}),
                           "NEEDS_ATTENTION")
    assert "resource 'doc:secret/x' of tool 'notes.write' is outside" in (
        await _events(engine, secret, "run.permission_denied"))[0]["reason"]
    # and two runs wait for the approval of their write, created under v1
    approved = [await _create(bus, "acme2", {"doc": f"public/{n}", "calls": ["write"], "approve": True})
                for n in ("kept", "voided")]
    kept, voided = [await _run_in(engine, "acme2", key, "WAITING_USER") for key in approved]
    assert (await _events(engine, kept, "run.created"))[0]["permissions"]["policy_version"] == 1
    # When the first is approved under v1, its write is made
    assert (await _approve(ensemble, engine, kept)).status_code == 200
    await _run_in(engine, "acme2", approved[0], "COMPLETED")
    # but after the policy changes to v2 (no more writes), approving the second does not let it write
    set_v2 = await _operator(ensemble, "PUT", "/tenants/acme2/policy",
                             {"tools": ["notes.read"], "resources": ["doc:public/*"], "reason": "read-only now"})
    assert set_v2.json()["version"] == 2
    assert (await _approve(ensemble, engine, voided)).status_code == 200
    await _run_in(engine, "acme2", approved[1], "NEEDS_ATTENTION")
    # Then the far side saw the first write only, and the refusal says the approval no longer holds
    assert [(c["tool"], c["doc"]) for c in _far_side(calls)] == [("notes.write", "public/kept")]
    denied = (await _events(engine, voided, "run.permission_denied"))[0]
    assert denied["reason"].startswith("approval 'ok:0' no longer holds: the tenant policy changed from v1 to v2; "
                                       "tool 'notes.write' is outside")
    assert await _actions(engine, voided) == []
    # and the policy changes are on the audit log
    async with engine.connect() as conn:
        audited = (await conn.execute(text("SELECT reason FROM audit_log WHERE action = 'tenant_policy.set' "
                                           "AND target = 'acme2' ORDER BY id"))).scalars().all()
    assert audited == ["onboarding", "read-only now"]


async def _approve(ensemble: Ensemble, engine, run_id: str) -> httpx.Response:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        wait = (await conn.execute(text("SELECT approval_id, approved_hash FROM runs WHERE run_id = :r"),
                                   {"r": run_id})).one()
    return await _operator(ensemble, "POST", f"/runs/{run_id}/approve",
                           {"approval_id": wait.approval_id, "approved_hash": wait.approved_hash, "reason": "ok"},
                           await bearer(engine, "user_42"))


async def test_a_call_outside_the_scope_asks_for_an_approval_where_the_kind_says_so(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given a kind whose calls outside the scope ask user_42, and a run narrowed to reading
    ensemble, calls = _start(services, tmp_path, "gateway", "scheduler", "relay", "worker")
    key = await _create(bus, "acme", {"doc": "public/c", "calls": ["delete"]}, workflow="notes_asking",
                        scope={"tools": ["notes.read"]})
    # When decide asks for notes.delete, the run waits for an approval of exactly that request
    run_id = await _run_in(engine, "acme", key, "WAITING_USER")
    assert _far_side(calls) == []
    async with engine.connect() as conn:
        wait = (await conn.execute(text("SELECT approval_id, approval_owner FROM runs WHERE run_id = :r"),
                                   {"r": run_id})).one()
    assert (wait.approval_id, wait.approval_owner) == ("scope:delete:0", "user_42")
    # and once approved, the call is made once, under that approval, and the run completes
    assert (await _approve(ensemble, engine, run_id)).status_code == 200
    await _run_in(engine, "acme", key, "COMPLETED")
    assert [c["tool"] for c in _far_side(calls)] == ["notes.delete"]
    prepared = await _events(engine, run_id, "action.prepared")
    assert [(p["tool"], p["approval_id"]) for p in prepared] == [("notes.delete", "scope:delete:0")]


@pytest.mark.long
async def test_a_v3_deadline_ends_the_run_timed_out_through_the_timer_service(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given a run that waits for an event that never comes, created with a deadline 3 s away
    _, calls = _start(services, tmp_path, "scheduler", "relay", "worker", "timer")
    await _run_in(engine, "acme", await _create(bus, "acme", {"doc": "public/d", "calls": []}), "COMPLETED")  # up
    deadline = datetime.now(UTC) + timedelta(seconds=3)
    key = await _create(bus, "acme", {"doc": "public/d", "calls": ["write"], "wait": True},
                        deadline=deadline.isoformat())
    run_id = await _run_in(engine, "acme", key, "WAITING_EVENT")
    assert (await _events(engine, run_id, "run.created"))[0]["deadline"] == pytest.approx(deadline.timestamp())
    # When the deadline passes, the timer service ends it TIMED_OUT (its wait had an hour left)
    started = time.monotonic()
    await _run_in(engine, "acme", key, "TIMED_OUT")
    assert time.monotonic() - started < 15
    changes = await _events(engine, run_id, "run.status_changed")
    assert changes[-1]["to"] == "TIMED_OUT" and changes[-1]["reason"].startswith("business_deadline:")
    async with engine.connect() as conn:
        timer = (await conn.execute(text("SELECT kind, fired_at IS NOT NULL AS fired FROM timers "
                                         "WHERE run_id = :r AND kind = 'business_deadline'"), {"r": run_id})).one()
    assert timer.fired and _far_side(calls) == []


async def test_a_tenant_policy_keeps_the_example_agent_off_other_repositories(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given the dependency-upgrade agent (forge.* on any repo) and tenant acme3 limited to acme/web
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_forge()
    ensemble.start_services("gateway", "scheduler", "worker", "relay")
    await ensemble.configure_forge()
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    set_it = await _longrunctl(ensemble, "tenant", "policy", "acme3", "--tool", "forge.*", "--resource",
                               "repo:acme/web", "--reason", "web team only")
    shown = await _longrunctl(ensemble, "tenant", "policy", "acme3")
    assert set_it == shown == {"tenant_id": "acme3", "version": 1, "tools": ["forge.*"],
                               "resources": ["repo:acme/web"]}
    # When a run of it is asked to upgrade acme/payments
    key = new_key()
    await publish_create(bus, tenant="acme3", key=key, input_=goal("scoped"))
    run_id = await _run_in(engine, "acme3", key, "NEEDS_ATTENTION")
    # Then the forge was never called, and the refusal names the repository and the scope
    assert await ensemble.forge_effects() == []
    denied = (await _events(engine, run_id, "run.permission_denied"))[0]
    assert (denied["tool"], denied["resource"]) == ("forge.create_branch", "repo:acme/payments")
    assert "resources ['repo:acme/web'], tenant policy v1" in denied["reason"]


async def _longrunctl(ensemble: Ensemble, *args: str) -> Any:
    """The operator's CLI against the gateway; its JSON answer."""
    result = await asyncio.to_thread(CliRunner().invoke, ctl.main, ["--url", ensemble.gateway_url, "--token",
                                                                   OPERATOR_TOKEN, "-o", "json",
                                                                   *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)
