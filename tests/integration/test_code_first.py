"""A code-first run kind end to end through the real services (gateway, scheduler, worker, relay, timer):
``tour`` (``tests/integration/code_first_kinds.py``) calls a tool, asks the scripted model, makes two calls
at once, asks a question answered through the operator API, waits for a signal, sleeps on a durable
timer, starts a child run and waits for it, asks for the approval of its exact write, and makes it."""

from __future__ import annotations

import httpx
import pytest
from longrun.db import actions as ledger
from longrun.db import runs
from longrun.domain import RunStatus, TERMINAL
from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, event_types, new_key, publish_create, run_id_for
from tests.integration.identities import bearer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
async def ensemble(clean, engine, bus, services, tmp_path):  # type: ignore[no-untyped-def]
    ensemble = Ensemble(services, tmp_path)
    ensemble.env.update({"LONGRUN_RUN_KINDS": "tests.integration.code_first_kinds:kinds", "LONGRUN_MODEL": "scripted"})
    ensemble.start_services("gateway", "scheduler", "worker", "relay", "timer")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    return ensemble


@pytest.mark.long
async def test_a_code_first_run_goes_through_every_await_and_completes_with_its_output(
        ensemble, engine, bus) -> None:  # type: ignore[no-untyped-def]
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, workflow="tour",
                         input_={"name": "svc", "event": False, "pause": 0.5})
    run_id = str(await eventually(lambda: run_id_for(engine, "acme", key), what="the run"))
    acted: list[str] = []

    async def people() -> bool:
        async with engine.connect() as conn:
            stored = await runs.load(conn, run_id)
        assert stored is not None
        run, wait = stored.snapshot, stored.snapshot.wait
        async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as gateway:
            if run.status is RunStatus.WAITING_USER and wait is not None and wait.question_id and "answer" not in acted:
                (await gateway.post(f"/runs/{run_id}/answer", headers=await bearer(engine, "alice"), json={
                    "question_id": wait.question_id, "answer": {"module": "billing"}, "reason": "test"})
                 ).raise_for_status()
                acted.append("answer")
            elif run.status is RunStatus.WAITING_EVENT and wait is not None and wait.kind == "signal" \
                    and "signal" not in acted:
                (await gateway.post(f"/runs/{run_id}/signals", headers=await bearer(engine, "ops", "operator"),
                                    json={"signal_id": "go-1", "name": "go", "payload": {"by": "ana"},
                                          "reason": "test"})).raise_for_status()
                acted.append("signal")
            elif run.status is RunStatus.WAITING_USER and wait is not None and wait.approval_id \
                    and "approval" not in acted:
                (await gateway.post(f"/runs/{run_id}/approve", headers=await bearer(engine, "alice"), json={
                    "approval_id": wait.approval_id, "approved_hash": wait.approved_hash, "reason": "test"})
                 ).raise_for_status()
                acted.append("approval")
        return run.status in TERMINAL or run.status is RunStatus.NEEDS_ATTENTION

    await eventually(people, timeout=90, interval=0.2, what="the tour to finish")
    events = await event_types(engine, run_id)
    [completed] = [d for t, d in events if t == "run.completed"]
    evidence = completed["evidence"]
    assert (evidence["greeting"], evidence["plan"], evidence["parallel"], evidence["module"], evidence["signal"]) == (
        "hello svc", "publish", ["a", "b"], "billing", {"by": "ana"})
    assert acted == ["answer", "signal", "approval"] and len(evidence["children"]) == 1
    marks = [d["patch"].split(":")[2] for t, d in events if t == "run.patch_taken"]
    assert marks == ["call", "model", "question", "signal", "timer", "children_started", "children", "approval",
                     "call"]
    async with engine.connect() as conn:
        actions = {row.logical_action: row.status for row in await ledger.for_run(conn, run_id)}
    assert actions == {"greet": "CONFIRMED", "2.0:tour.echo": "CONFIRMED", "2.1:tour.echo": "CONFIRMED",
                       "publish": "CONFIRMED"}
