"""Signals through the real services (gateway, scheduler, relay, worker, timer) and the operator API:
a run of ``signalled`` waits for its ``ship`` signal; one sent twice is recorded once and wakes it
once, one its kind refuses (unknown name, payload against the schema) is answered 422 and changes
nothing, a caller of another tenant is answered 404 and changes nothing, one sent after the run
completed is kept in its history (not applied) and wakes nothing, and ``longrunctl run signal``
sends one."""

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

from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, event_types, new_key, publish_create, run_id_for, status_of
from tests.integration.identities import bearer, token
from tests.integration.signal_kinds import STEPS_FILE

pytestmark = pytest.mark.integration

LONGRUNCTL = Path(sys.executable).parent / "longrunctl"


@pytest.fixture
async def signalled(clean, engine, bus, services, tmp_path):  # type: ignore[no-untyped-def]
    """The ensemble running the test-only ``signalled`` kind, the file its steps are counted in, and a
    function that starts a run of it in a tenant and returns its id once it waits for its signal."""
    steps = tmp_path / "steps"
    ensemble = Ensemble(services, tmp_path)
    ensemble.env["LONGRUN_RUN_KINDS"] = "tests.integration.signal_kinds:SIGNALLED"
    ensemble.start_services("gateway", "scheduler", "worker", "relay", "timer", **{STEPS_FILE: str(steps)})
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")

    async def start(tenant: str) -> str:
        key = new_key()
        await publish_create(bus, tenant=tenant, key=key, workflow="signalled", input_={})
        run_id = str(await eventually(lambda: run_id_for(engine, tenant, key), what="the run"))
        await eventually(lambda: _is(engine, run_id, "WAITING_EVENT"), timeout=30, what="the wait for ship")
        return run_id

    return ensemble, steps, start


@pytest.mark.long
async def test_a_signal_is_checked_recorded_once_wakes_its_run_once_and_is_kept_when_late(
        signalled, engine) -> None:  # type: ignore[no-untyped-def]
    ensemble, steps, start = signalled
    run_id = await start("acme")
    ops = await bearer(engine, "ops", "operator")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        async def send(signal_id: str, name: str, payload: Any, headers: dict[str, str] = ops) -> httpx.Response:
            return await http.post(f"/runs/{run_id}/signals", headers=headers, json={
                "signal_id": signal_id, "name": name, "payload": payload, "reason": "test"})

        view = (await http.get(f"/runs/{run_id}", headers=ops)).json()
        assert view["waiting_for"] == "signal:ship" and view["next_timer"]["kind"] == "wait_deadline"
        stored = await _stored(engine, run_id)
        # When a signal its kind does not declare, and one whose payload breaks the schema, are sent
        unknown = await send("s-0", "deploy", {})
        assert unknown.status_code == 422, unknown.text
        assert "accepts no signal named 'deploy' (it accepts: note, ship)" in unknown.json()["error"]
        bad = await send("s-0", "ship", {"by": "ana", "when": "now"})
        assert bad.status_code == 422, bad.text
        assert bad.json()["problems"] == ["payload: Additional properties are not allowed ('when' was unexpected)"]
        # and a caller who sees only another tenant sends the right one
        other = await send("s-0", "ship", {"by": "mallory"}, await bearer(engine, "mallory", "operator",
                                                                         tenants=("other",)))
        assert other.status_code == 404, other.text
        # Then each is refused and nothing changed
        assert await _stored(engine, run_id) == stored
        assert await _status(engine, run_id) == "WAITING_EVENT"

        # When the right one is sent twice (a retry after a lost answer)
        sent = await asyncio.gather(send("ship-1", "ship", {"by": "ana"}), send("ship-1", "ship", {"by": "ana"}))
        assert [r.status_code for r in sent] == [200, 200], [r.text for r in sent]
        assert sorted(r.json()["outcome"] for r in sent) == ["duplicate", "woke"]
        # Then the run completes, woken by it, having recorded it once and stepped once more
        await eventually(lambda: _is(engine, run_id, "COMPLETED"), timeout=30, what="COMPLETED")
        events = await event_types(engine, run_id)
        assert [d["signal_id"] for t, d in events if t == "signal.received"] == ["ship-1"]
        [completed] = [d for t, d in events if t == "run.completed"]
        assert completed["evidence"]["woken_by"] == "ship-1"
        assert steps.read_text().split() == [run_id, run_id]
        assert await _audited(engine, run_id) == [("ops", "ship-1", "woke")]
        assert await _open_timers(engine, run_id) == 0  # the signal's write closed the wait's deadline

        # When a signal arrives after the run completed
        done = await _stored(engine, run_id)
        late = await send("ship-2", "ship", {"by": "bo"})
        assert late.status_code == 200, late.text
        assert (late.json()["outcome"], late.json()["status"]) == ("late", "COMPLETED")
        # Then it is kept in the history, not applied: same revision, no step, and the run view shows it
        assert await _late_signals(engine, run_id) == [("ship-2", False)]
        assert (await _stored(engine, run_id))[0] == done[0]
        await asyncio.sleep(1)
        assert steps.read_text().split() == [run_id, run_id]
        view = (await http.get(f"/runs/{run_id}", headers=ops)).json()
        assert view["snapshot"]["status"] == "COMPLETED"
        assert [e["signal_id"] for e in view["events"] if e["type"] == "signal.received"] == ["ship-1", "ship-2"]


async def test_longrunctl_signals_a_run(signalled, engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ensemble, _, start = signalled
    run_id = await start("acme")
    # When an operator sends a signal the schema refuses from a terminal, then the right one from a file
    refused = await _longrunctl(ensemble, engine, "run", "signal", run_id, "ship", "--payload", '{"by": ""}')
    assert refused.returncode == 1 and "422" in refused.stderr and "should be non-empty" in refused.stderr
    (tmp_path / "ship.json").write_text('{"by": "ana"}')
    sent = await _longrunctl(ensemble, engine, "run", "signal", run_id, "ship", "--payload",
                             f"@{tmp_path / 'ship.json'}", "--id", "release-7", "--reason", "release approved")
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["outcome"] == "woke" and "signal id: release-7" in sent.stderr
    # Then the run completes with it
    await eventually(lambda: _is(engine, run_id, "COMPLETED"), timeout=30, what="COMPLETED")
    [completed] = [d for t, d in await event_types(engine, run_id) if t == "run.completed"]
    assert completed["evidence"]["shipped_by"] == {"by": "ana"}


async def _longrunctl(ensemble: Ensemble, engine, *args: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    argv = [str(LONGRUNCTL), "--url", ensemble.gateway_url, "--token", await token(engine, "ops", "operator"),
            "-o", "json", *args]
    return await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60)


async def _status(engine, run_id: str) -> str | None:  # type: ignore[no-untyped-def]
    return await status_of(engine, run_id)


async def _is(engine, run_id: str, status: str) -> bool:  # type: ignore[no-untyped-def]
    return await status_of(engine, run_id) == status


async def _stored(engine, run_id: str) -> tuple[Any, ...]:  # type: ignore[no-untyped-def]
    """What a signal would change: the run's revision and events, and the audit rows about it."""
    async with engine.connect() as conn:
        revision = (await conn.execute(text("SELECT revision FROM runs WHERE run_id = :r"), {"r": run_id})).scalar()
        events = (await conn.execute(text("SELECT count(*) FROM run_events WHERE run_id = :r"),
                                     {"r": run_id})).scalar()
        audited = (await conn.execute(text("SELECT count(*) FROM audit_log WHERE target = :r"),
                                      {"r": run_id})).scalar()
    return revision, events, audited


async def _open_timers(engine, run_id: str) -> int:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT count(*) FROM timers WHERE run_id = :r AND fired_at IS NULL "
                                        "AND cancelled_at IS NULL"), {"r": run_id})).scalar_one()


async def _late_signals(engine, run_id: str) -> list[tuple[str, bool]]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT data ->> 'signal_id' AS id, applied FROM run_events WHERE run_id = :r "
                                       "AND type = 'signal.received' AND NOT applied ORDER BY seq"), {"r": run_id})
        return [(r.id, r.applied) for r in rows]


async def _audited(engine, run_id: str) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT actor, details FROM audit_log WHERE action = 'signal' AND target = :r "
                                       "ORDER BY id"), {"r": run_id})
        return [(r.actor, r.details["signal_id"], r.details["outcome"]) for r in rows]
