"""Seed 001's acceptance: a run waits for a person across a release. The only worker that runs its
version goes away and one that runs only the next version takes its place; the approval arrives; the
run waits, visibly and with one alert, for a worker that can run it (never taken, no failed step, no
lease loop) and then either a worker of its version returns, or an operator migrates it to the next
version, which declares it can take it over. Either way it publishes exactly once and completes.
Real processes: scheduler, relay, gateway, reconciler and workers."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from tests.fixtures import eventually
from tests.harness import ROOT
from tests.integration.ensemble import (
    Ensemble,
    event_types,
    new_key,
    publish_create,
    run_id_for,
    status_of,
)
from tests.integration.identities import bearer

pytestmark = pytest.mark.integration

PACKAGE = Path(__file__).parent / "fixtures" / "acme_release"
BOTH = "acme_release:V1,acme_release:V2"
ALERT = "alert.no_compatible_worker"


@pytest.fixture
async def waiting_across_a_release(clean, engine, bus, services, tmp_path):  # type: ignore[no-untyped-def]
    """A version-1 run approved while only a version-2 worker is up: (ensemble, run id, far side, http)."""
    far_side = tmp_path / "releases.jsonl"
    far_side.touch()
    ensemble = Ensemble(services, tmp_path)
    ensemble.env.update({"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "shared"), str(PACKAGE)]),
                         "ACME_RELEASES": str(far_side), "LONGRUN_RECONCILE_INTERVAL": "0.5"})
    # Given a deployment of version 1: the scheduler pins the newest version it knows
    ensemble.start("scheduler", "longrun.services.scheduler", LONGRUN_RUN_KINDS="acme_release:V1")
    ensemble.start("relay", "longrun.services.outbox_relay")
    ensemble.start("reconciler", "longrun.services.reconciler", LONGRUN_RUN_KINDS=BOTH)
    ensemble.start("gateway", "longrun.services.gateway", LONGRUN_RUN_KINDS=BOTH)
    worker_v1 = ensemble.start("worker", "longrun.services.worker", LONGRUN_RUN_KINDS="acme_release:V1")
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_={"release": "2026.12"}, workflow="acme_release")
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
    # And the run waits for a person's approval of the publish
    await eventually(lambda: _is(engine, run_id, "WAITING_USER"), timeout=30, what="WAITING_USER")
    assert (await _row(engine, run_id))["workflow_version"] == "1"
    # When version 1's only worker is retired and a worker that runs only version 2 is deployed
    worker_v1.terminate()
    ensemble.start("worker", "longrun.services.worker", LONGRUN_RUN_KINDS="acme_release:V2")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    await eventually(lambda: _serves_only_v2(engine), timeout=30, what="the version-2 worker's membership")
    token_before = (await _row(engine, run_id))["fencing_token"]
    # And the approval arrives
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, headers=await bearer(engine, "release-manager"),
                                 timeout=10) as http:
        snapshot = (await http.get(f"/runs/{run_id}")).json()["snapshot"]
        approved = await http.post(f"/runs/{run_id}/approve", json={
            "approval_id": "publish", "approved_hash": snapshot["wait"]["approved_hash"], "reason": "ship it"})
        assert approved.status_code == 200, approved.text
        # Then the run waits, visibly, for a worker that runs version 1
        await eventually(lambda: _waiting_for(http, run_id), timeout=30, what="the visible wait")
        assert (await http.get(f"/runs/{run_id}")).json()["waiting_for"] == \
            "a compatible worker: acme_release@1"
        # With one alert, which stays one while it waits (several reconciler rounds)
        await eventually(lambda: _alerts(engine, run_id), timeout=30, what="the alert")
        await asyncio.sleep(4)
        assert len(await _alerts(engine, run_id)) == 1
        # Never taken: no lease, the fencing token unchanged, no step and no failure, nothing published
        row = await _row(engine, run_id)
        assert (row["status"], row["lease_owner"], row["fencing_token"]) == ("READY", None, token_before)
        types = [kind for kind, _ in await event_types(engine, run_id)]
        assert types[-1] == "run.approval_decided", types
        assert not any(t.startswith("action.") for t in types), types
        assert _published(far_side) == []
        yield ensemble, run_id, far_side, http


@pytest.mark.long
async def test_a_worker_of_its_version_returns_and_it_completes_there(
        waiting_across_a_release, engine) -> None:  # type: ignore[no-untyped-def]
    ensemble, run_id, far_side, http = waiting_across_a_release
    # When a worker of version 1 joins again
    ensemble.start("worker", "longrun.services.worker", LONGRUN_RUN_KINDS="acme_release:V1")
    # Then the run resumes by itself on it and completes, published exactly once, by version 1
    await eventually(lambda: _is(engine, run_id, "COMPLETED"), timeout=30, what="COMPLETED")
    assert [p["by"] for p in _published(far_side)] == ["1"]
    events = await event_types(engine, run_id)
    assert [d["evidence"]["completed_by"] for t, d in events if t == "run.completed"] == ["1"]
    assert not any(t == "run.versions_migrated" for t, _ in events)
    assert (await http.get(f"/runs/{run_id}")).json()["waiting_for"] is None
    assert len(await _alerts(engine, run_id)) == 1


@pytest.mark.long
async def test_an_operator_migrates_it_to_the_next_version_and_it_completes_there(
        waiting_across_a_release, engine) -> None:  # type: ignore[no-untyped-def]
    ensemble, run_id, far_side, http = waiting_across_a_release
    # When an operator migrates the run to version 2, which declares it takes version-1 runs over
    migrated = await http.post(f"/runs/{run_id}/migrate", json={"to_version": "2", "reason": "version 1 retired"})
    assert migrated.status_code == 200, migrated.text
    # Then the version-2 worker completes it, published exactly once, by version 2
    await eventually(lambda: _is(engine, run_id, "COMPLETED"), timeout=30, what="COMPLETED")
    assert [p["by"] for p in _published(far_side)] == ["2"]
    events = await event_types(engine, run_id)
    assert [d["evidence"]["completed_by"] for t, d in events if t == "run.completed"] == ["2"]
    # And the history records the migration: the new pins, who and why
    [moved] = [d for t, d in events if t == "run.versions_migrated"]
    assert (moved["versions"]["workflow"], moved["by"], moved["reason"]) == ("2", "release-manager",
                                                                            "version 1 retired")
    assert (await _row(engine, run_id))["workflow_version"] == "2"
    assert len(await _alerts(engine, run_id)) == 1


def _published(far_side: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in far_side.read_text().splitlines()]


async def _is(engine, run_id: str, status: str) -> bool:  # type: ignore[no-untyped-def]
    return await status_of(engine, run_id) == status


async def _row(engine, run_id: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        row = (await conn.execute(text("SELECT status, workflow_version, lease_owner, fencing_token FROM runs "
                                       "WHERE run_id = :r"), {"r": run_id})).one()
    return dict(row._mapping)


async def _serves_only_v2(engine) -> bool:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT advertised FROM service_members WHERE service = 'worker' "
                                        "AND alive_until > now()"))).all()
    versions = {(p["kind"], p["workflow"]) for row in rows for p in row.advertised}
    return ("acme_release", "2") in versions and ("acme_release", "1") not in versions


async def _waiting_for(http: httpx.AsyncClient, run_id: str) -> bool:
    return (await http.get(f"/runs/{run_id}")).json()["waiting_for"] is not None


async def _alerts(engine, run_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return list((await conn.execute(text("SELECT reason FROM audit_log WHERE action = :a AND target = :r"),
                                        {"a": ALERT, "r": run_id})).scalars())
