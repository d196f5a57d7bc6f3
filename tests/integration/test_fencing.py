"""A worker frozen mid-call loses its run to another worker, and its late write is refused by the fencing token."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, goal, new_key, publish_create, run_id_for, status_of
from tests.integration.test_unknown_outcome import approve_when_asked

pytestmark = [pytest.mark.integration, pytest.mark.fault]


async def holder(engine, run_id: str):  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT lease_owner, fencing_token FROM runs WHERE run_id = :r"),
                                   {"r": run_id})).first()


@pytest.mark.long
async def test_a_stalled_worker_is_fenced_out_and_the_run_finishes_elsewhere(clean, engine, bus, services,
                                                                              tmp_path) -> None:
    # Given two workers, and a forge that holds the first commit's answer for a while
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_forge()
    env = {"LONGRUN_RUN_LEASE_TTL": "3", "LONGRUN_FORGE_TIMEOUT": "20", "LONGRUN_RECONCILE_INTERVAL": "0.5",
           "LONGRUN_AMQP_HEARTBEAT": "2"}
    ensemble.start_services("gateway", "scheduler", "relay", "reconciler", "timer", **env)
    workers = {p.name: p for p in (ensemble.start("worker", "longrun.services.worker", **env) for _ in range(2))}
    await ensemble.configure_forge(faults=({"endpoint": "commits", "mode": "timeout_after_commit",
                                            "times": 1, "hold_seconds": 8},))
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")  # the forge's webhooks are delivered once
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_=goal("fence"))
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
    # When the worker holding the run is frozen (SIGSTOP) in the middle of the commit call
    await eventually(lambda: _submitted(engine, run_id, "commit:1"), timeout=60, what="commit:1 submitted")
    owner, token = await holder(engine, run_id)
    stalled = workers[owner]
    stalled.pause()
    try:
        # Then after the lease expires the other worker takes the run with a higher token and finishes it
        await eventually(lambda: _taken_over(engine, run_id, token), timeout=30, what="a takeover")
        await eventually(lambda: approve_when_asked(engine, ensemble, run_id), timeout=60, what="the approval")
        await eventually(lambda: _completed(engine, run_id), timeout=60, what="completion")
    finally:
        stalled.resume()
    # and when the frozen worker wakes up, its late write is refused and changes nothing
    await eventually(lambda: _logged(stalled, f"lease {token} lost"), timeout=30, what="the stale write refused")
    async with engine.connect() as conn:
        stale_writes = (await conn.execute(text(
            "SELECT count(*) FROM run_events WHERE run_id = :r AND fencing_token = :t AND seq > "
            "(SELECT min(seq) FROM run_events WHERE run_id = :r AND fencing_token > :t)"),
            {"r": run_id, "t": token})).scalar()
    assert stale_writes == 0
    assert await status_of(engine, run_id) == "COMPLETED"
    commits = [e for e in await ensemble.forge_effects() if e["kind"] == "commit"]
    assert all(e["count"] == 1 for e in commits)


async def _submitted(engine, run_id: str, action: str) -> bool:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return bool((await conn.execute(text(
            "SELECT count(*) FROM run_events WHERE run_id = :r AND type = 'action.submitted' "
            "AND data->>'logical_action' = :a"), {"r": run_id, "a": action})).scalar())


async def _taken_over(engine, run_id: str, token: int) -> bool:  # type: ignore[no-untyped-def]
    row = await holder(engine, run_id)
    async with engine.connect() as conn:
        later = (await conn.execute(text(
            "SELECT count(*) FROM run_events WHERE run_id = :r AND fencing_token > :t"),
            {"r": run_id, "t": token})).scalar()
    return bool(later) or (row is not None and row.fencing_token > token and row.lease_owner is not None)


async def _completed(engine, run_id: str) -> bool:  # type: ignore[no-untyped-def]
    return await status_of(engine, run_id) == "COMPLETED"


async def _logged(process, text_: str) -> bool:  # type: ignore[no-untyped-def]
    return text_ in process.output()
