"""Before retiring old code an operator reads, per run kind and pinned versions, the open runs, the
oldest wait and the live workers that advertise those versions (GET /versions, longrunctl versions)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest

from tests.fixtures import eventually
from tests.integration.ensemble import OPERATOR_TOKEN, Ensemble
from tests.integration.runs_factory import VERSIONS, created, waiting_for_user

pytestmark = pytest.mark.integration


def entry(report: list[dict[str, Any]], kind: str, workflow: str) -> dict[str, Any] | None:
    return next((e for e in report if e["kind"] == kind and e["versions"]["workflow"] == workflow), None)


async def test_versions_show_open_runs_and_the_live_workers_serving_them(clean, engine, services,
                                                                          tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given a worker that runs the built-in kinds (the upgrade at versions 1 and 2), a run at version 1
    # waiting for an approval, and a run pinned to a version 3 that no worker serves
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway")
    ensemble.start("worker", "longrun.services.worker", LONGRUN_INSTANCE_ID="worker-v1")
    await waiting_for_user(engine, approval_id="merge", approved_hash="a" * 64)
    await created(engine, versions=replace(VERSIONS, workflow="3"))
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    headers = {"authorization": f"Bearer {OPERATOR_TOKEN}"}
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, headers=headers, timeout=10) as http:

        async def advertised() -> list[dict[str, Any]] | None:
            report = (await http.get("/versions")).json()
            served = entry(report, "dependency_upgrade", "1")
            return report if served and served["served_by"] else None

        # When the operator asks which versions are in use
        report = await eventually(advertised, what="the worker's advertisement")
        assert (await http.get("/versions", headers={"authorization": "Bearer wrong"})).status_code == 401
    # Then version 1 has its waiting run and its worker, with every pin the worker runs it at
    v1 = entry(report, "dependency_upgrade", "1")
    assert v1 is not None and v1["versions"] == {"workflow": "1", "prompt": VERSIONS.prompt,
                                                 "model_policy": VERSIONS.model_policy,
                                                 "tool_schemas": VERSIONS.tool_schemas}
    assert v1["open_runs"] == {"WAITING_USER": 1} and v1["oldest_wait"] is not None
    assert v1["served_by"] == ["worker-v1"]
    # And version 3 has an open run and nobody to run it
    v3 = entry(report, "dependency_upgrade", "3")
    assert v3 is not None and v3["open_runs"] == {"READY": 1} and v3["served_by"] == []
    # And a kind with no open run is listed for the worker that serves it
    steps = entry(report, "steps", "1")
    assert steps is not None and steps["open_runs"] == {} and steps["served_by"] == ["worker-v1"]
