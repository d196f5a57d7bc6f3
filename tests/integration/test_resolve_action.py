"""An operator settles an action in doubt with what they found on the far side, through the real
ensemble (no reconciler runs, so nothing but the person can): ``longrunctl run resolve`` --done
with the forge's receipt, or --not-done after the forge shows nothing under the key; either way the
run completes with exactly one merge request on the forge. Bad resolutions are refused, naming why,
and change nothing. A merge request that FAILED is retried by an operator (``longrunctl run
retry-action``) under its key; retrying an action that did not fail is refused (409) and changes nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.bus.connection import Bus
from longrun.db import actions as ledger
from longrun.db import runs
from longrun.domain import TERMINAL, RunStatus
from tests.fixtures import eventually
from tests.integration.ensemble import OPERATOR_TOKEN, Ensemble, goal, new_key, publish_create, run_id_for
from tests.integration.identities import bearer, token

pytestmark = pytest.mark.integration

LONGRUNCTL = Path(sys.executable).parent / "longrunctl"
MR = "merge_request"
SERVICES = (("gateway", "longrun.services.gateway"), ("scheduler", "longrun.services.scheduler"), ("relay", "longrun.services.outbox_relay"),
            ("timer", "longrun.services.timer"))


def _start(ensemble: Ensemble, tmp: Path, **worker_env: str) -> None:
    """Everything but the reconciler: an action in doubt stays so until a person settles it."""
    common = {"LONGRUN_FORGE_TIMEOUT": "2", "LONGRUN_ARTIFACT_DIR": str(tmp / "artifacts")}
    for name, module in SERVICES:
        ensemble.start(name, module, **common)
    ensemble.start("worker", "longrun.services.worker", **common, **worker_env)


async def _until(engine: AsyncEngine, ensemble: Ensemble, run_id: str, *statuses: RunStatus) -> runs.StoredRun:
    """Approve the merge when asked, until the run is in one of ``statuses``."""
    async def reached() -> runs.StoredRun | None:
        stored = await _approve_if_asked(engine, ensemble, run_id)
        return stored if stored.snapshot.status in statuses else None

    return await eventually(reached, timeout=75, interval=0.2, what=f"the run to be {'/'.join(statuses)}")


async def _approve_if_asked(engine: AsyncEngine, ensemble: Ensemble, run_id: str) -> runs.StoredRun:
    async with engine.connect() as conn:
        stored = await runs.load(conn, run_id)
    assert stored is not None
    wait = stored.snapshot.wait
    if stored.snapshot.status is RunStatus.WAITING_USER and wait is not None:
        async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as gateway:
            await gateway.post(f"/runs/{run_id}/approve", json={
                "approval_id": wait.approval_id, "approved_hash": wait.approved_hash, "reason": "reviewed"},
                headers=await bearer(engine, wait.owner or "user_42"))
    return stored


async def _created(engine: AsyncEngine, bus: Bus) -> str:
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_=goal(key[-8:]))
    return await eventually(lambda: run_id_for(engine, "acme", key), timeout=30, what="the run")


async def _longrunctl(ensemble: Ensemble, engine: AsyncEngine, *args: str) -> subprocess.CompletedProcess[str]:
    """longrunctl as ana, an operator."""
    argv = [str(LONGRUNCTL), "--url", ensemble.gateway_url, "--token", await token(engine, "ana", "operator"),
            "-o", "json", *args]
    return await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60)


async def _trail(engine: AsyncEngine, run_id: str) -> list[str]:
    async with engine.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT type, data FROM run_events WHERE run_id = :r ORDER BY seq"), {"r": run_id})).all()
    return [t for t, d in rows if d.get("logical_action") == MR or t == "run.completed"]


async def _merge_requests(ensemble: Ensemble) -> int:
    return sum(e["count"] for e in await ensemble.forge_effects() if e["kind"] == "merge_request")


async def _forge_lookup(ensemble: Ensemble, key: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=ensemble.forge_url, timeout=10) as forge:
        return await forge.get("/lookup", params={"idempotency_key": key})


@pytest.mark.long
async def test_an_unknown_action_resolved_with_the_forges_receipt_completes_the_run_with_one_effect(
        clean, engine, bus, services, tmp_path) -> None:
    # Given a forge that creates the merge request but holds its answer past the worker's timeout
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_forge()
    await ensemble.configure_forge(faults=({"endpoint": "merge_requests", "mode": "timeout_after_commit",
                                            "times": 1, "hold_seconds": 15},))
    _start(ensemble, tmp_path)
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    run_id = await _created(engine, bus)
    stored = await _until(engine, ensemble, run_id, RunStatus.ACTION_UNKNOWN, *TERMINAL)
    assert stored.snapshot.status is RunStatus.ACTION_UNKNOWN, stored.snapshot.terminal_reason
    action = stored.snapshot.action(MR)
    assert action is not None and action.status.value == "UNKNOWN"
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as api:
        shown = (await api.get(f"/runs/{run_id}", headers={"authorization": f"Bearer {OPERATOR_TOKEN}"})).json()
    assert shown["allowed_operations"] == ["resolve", "pause", "cancel", "terminate"]

    # When the operator finds it on the forge by its idempotency key and resolves it with that receipt
    found = await _forge_lookup(ensemble, action.idempotency_key)
    assert found.status_code == 200, found.text
    receipt = found.json()["object"]
    resolved = await _longrunctl(ensemble, engine, "run", "resolve", run_id, MR, "--done", "--external-id", str(receipt["id"]),
                                 "--receipt", json.dumps(receipt), "--reason", "MR found on the forge by its key")
    assert resolved.returncode == 0, resolved.stderr
    assert json.loads(resolved.stdout)["action"] == {"logical_action": MR, "status": "CONFIRMED"}

    # Then the run completes on that receipt, with exactly one merge request on the forge
    done = await _until(engine, ensemble, run_id, *TERMINAL)
    assert done.snapshot.status is RunStatus.COMPLETED, done.snapshot.terminal_reason
    assert await _merge_requests(ensemble) == 1
    assert await _trail(engine, run_id) == ["action.prepared", "action.submitted", "action.unknown",
                                            "action.reconciliation_started", "action.resolved", "run.completed"]
    fact = done.snapshot.fact(f"receipt:{MR}")
    assert fact is not None and fact.source == "operator:ana" and dict(fact.value)["id"] == receipt["id"]
    async with engine.connect() as conn:
        row = next(r for r in await ledger.for_run(conn, run_id) if r.logical_action == MR)
        audit = (await conn.execute(text(
            "SELECT actor, action, reason, details->>'outcome' FROM audit_log WHERE target = :r "
            "AND action = 'resolve'"), {"r": run_id})).all()
    assert (row.status, row.external_id) == ("CONFIRMED", str(receipt["id"]))
    assert [tuple(a) for a in audit] == [("ana", "resolve", "MR found on the forge by its key", "CONFIRMED")]

    # and resolving it again is refused, naming what the action is now
    again = await _longrunctl(ensemble, engine, "run", "resolve", run_id, MR, "--not-done", "--reason", "second thoughts")
    assert again.returncode != 0 and "the action is CONFIRMED, not in doubt" in again.stdout + again.stderr


@pytest.mark.long
async def test_an_action_the_forge_never_saw_is_resolved_not_done_over_a_stuck_reconciliation_and_sent_again(
        clean, engine, bus, services, tmp_path) -> None:
    # Given a worker that dies right before sending its 6th request (the merge request), and a forge
    # that is down when the reconciler asks it, so the reconciliation is stuck
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_forge()
    await ensemble.configure_forge()
    _start(ensemble, tmp_path, LONGRUN_CRASH_POINTS="worker.before_tool_request:6", LONGRUN_RUN_LEASE_TTL="3")
    crashing = services.started[-1]
    ensemble.start("reconciler", "longrun.services.reconciler", LONGRUN_RECONCILE_INTERVAL="0.5")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    run_id = await _created(engine, bus)
    async def dead() -> bool:
        await _approve_if_asked(engine, ensemble, run_id)
        return not crashing.alive()

    await eventually(dead, timeout=60, what="the worker to die before the merge request")
    await _outage(ensemble, 120)
    ensemble.start("worker", "longrun.services.worker", LONGRUN_FORGE_TIMEOUT="2", LONGRUN_RUN_LEASE_TTL="3",
                   LONGRUN_ARTIFACT_DIR=str(tmp_path / "artifacts"))
    row = await eventually(lambda: _deferred(engine, run_id), timeout=60, what="the reconciliation to be stuck")
    assert row.status == "RECONCILING" and row.last_error

    # When bad resolutions come first: each is refused, naming why, and changes nothing
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10,
                                 headers=await bearer(engine, "ana", "operator")) as api:
        refusals: list[tuple[int, str]] = []
        for body in ({"logical_action": MR, "outcome": "confirmed", "reason": "no id"},
                     {"logical_action": MR, "outcome": "maybe", "reason": "unsure"},
                     {"logical_action": MR, "outcome": "not_done", "external_id": "7", "reason": "contradicts"},
                     {"logical_action": "nothing", "outcome": "not_done", "reason": "wrong action"}):
            response = await api.post(f"/runs/{run_id}/resolve", json=body)
            refusals.append((response.status_code, response.json()["error"]))
    assert refusals == [
        (422, f"run {run_id}: resolving {MR!r} refused: a confirmation needs the external id found on the far side"),
        (422, "outcome must be one of confirmed, not_done, not 'maybe'"),
        (422, f"run {run_id}: resolving {MR!r} refused: an action not done has no external id or receipt"),
        (409, f"run {run_id}: resolving 'nothing' is not pending (the run has no action 'nothing')")]
    assert (await _trail(engine, run_id))[-1] == "action.reconciliation_started"

    # and then, the forge back, the operator sees nothing under its key and resolves it not done
    await _outage(ensemble, 0)
    assert (await _forge_lookup(ensemble, row.idempotency_key)).status_code == 404
    resolved = await _longrunctl(ensemble, engine, "run", "resolve", run_id, MR, "--not-done",
                                 "--reason", "nothing on the forge under its key")
    assert resolved.returncode == 0, resolved.stderr

    # Then the worker submits it again under the same key, and the run completes with one merge request
    done = await _until(engine, ensemble, run_id, *TERMINAL)
    assert done.snapshot.status is RunStatus.COMPLETED, done.snapshot.terminal_reason
    assert await _merge_requests(ensemble) == 1
    assert await _trail(engine, run_id) == [
        "action.prepared", "action.submitted", "action.unknown", "action.reconciliation_started", "action.resolved",
        "action.submitted", "action.confirmed", "run.completed"]
    async with engine.connect() as conn:
        settled = next(r for r in await ledger.for_run(conn, run_id) if r.logical_action == MR)
    assert (settled.status, settled.attempts, settled.idempotency_key) == ("CONFIRMED", 2, row.idempotency_key)


async def _outage(ensemble: Ensemble, seconds: float) -> None:
    async with httpx.AsyncClient(base_url=ensemble.forge_url, timeout=10) as forge:
        (await forge.post("/_control/unavailable", json={"seconds": seconds})).raise_for_status()


async def _deferred(engine: AsyncEngine, run_id: str) -> Any:
    """The merge request's ledger row once a reconciliation of it could not get an answer."""
    async with engine.connect() as conn:
        return (await conn.execute(text(
            "SELECT status, last_error, idempotency_key FROM actions WHERE run_id = :r AND logical_action = :a "
            "AND status = 'RECONCILING' AND last_error IS NOT NULL"), {"r": run_id, "a": MR})).first()


@pytest.mark.long
async def test_a_failed_merge_request_retried_by_an_operator_completes_the_run_with_one_effect(
        clean, engine, bus, services, tmp_path) -> None:
    # Given a forge unavailable for the merge request once, and a worker that does not retry by itself:
    # the merge request FAILED, and the run, whose decide asks for it again, waits for a person
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_forge()
    await ensemble.configure_forge(faults=({"endpoint": "merge_requests", "mode": "fail_before_commit", "times": 1},))
    _start(ensemble, tmp_path, LONGRUN_RETRY_MAXIMUM_ATTEMPTS="1")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    run_id = await _created(engine, bus)
    stored = await _until(engine, ensemble, run_id, RunStatus.NEEDS_ATTENTION, *TERMINAL)
    assert stored.snapshot.status is RunStatus.NEEDS_ATTENTION, stored.snapshot.terminal_reason
    failed = stored.snapshot.action(MR)
    assert failed is not None and failed.status.value == "FAILED"
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10,
                                 headers=await bearer(engine, "ana", "operator")) as api:
        shown = (await api.get(f"/runs/{run_id}")).json()
        assert shown["allowed_operations"] == ["retry-action", "retry", "pause", "cancel", "terminate"]

        # When an operator first retries an action that did not fail: refused, naming why, nothing changes
        confirmed = next(a.logical_action for a in stored.snapshot.actions if a.status.value == "CONFIRMED")
        refused = await api.post(f"/runs/{run_id}/retry-action", json={"logical_action": confirmed,
                                                                        "reason": "by mistake"})
        assert (refused.status_code, refused.json()["error"]) == (
            409, f"run {run_id}: retrying {confirmed!r} is not pending (the action is CONFIRMED, not FAILED)")
        unchanged = (await api.get(f"/runs/{run_id}")).json()
        assert unchanged["snapshot"]["revision"] == shown["snapshot"]["revision"]

    # and then retries the merge request through longrunctl
    retried = await _longrunctl(ensemble, engine, "run", "retry-action", run_id, MR, "--reason", "forge is back")
    assert retried.returncode == 0, retried.stderr
    assert json.loads(retried.stdout)["action"] == {"logical_action": MR, "status": "RETRYABLE"}

    # Then it is sent again under the same key and the run completes with exactly one merge request
    done = await _until(engine, ensemble, run_id, *TERMINAL)
    assert done.snapshot.status is RunStatus.COMPLETED, done.snapshot.terminal_reason
    assert await _merge_requests(ensemble) == 1
    async with engine.connect() as conn:
        row = next(r for r in await ledger.for_run(conn, run_id) if r.logical_action == MR)
        audit = (await conn.execute(text(
            "SELECT actor, reason, details->>'logical_action' FROM audit_log WHERE target = :r "
            "AND action = 'retry-action'"), {"r": run_id})).all()
    assert (row.status, row.idempotency_key) == ("CONFIRMED", failed.idempotency_key)
    assert [tuple(a) for a in audit] == [("ana", "forge is back", MR)]
