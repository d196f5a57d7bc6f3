"""Cleanup at closure through the real services: the reconciler runs a finished run's cleanup steps
through the action ledger; a failing step is retried with backoff under one alert, resolved once it
succeeds, and never changes how the run ended; a TERMINATED run runs none.

The run kind is ``tests/integration/cleanup_kinds.py``: its far side is a file of attempts and one of
effects, each line naming its idempotency key.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from longrun.app.gateway import operate
from longrun.bus import topology
from longrun.bus.codec import broker_user, to_message
from longrun.db import gauges
from longrun.db.transaction import PgTransaction
from longrun.domain import cleanup
from longrun.envelope import make
from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, event_types, new_key, run_id_for, status_of

pytestmark = pytest.mark.integration

STEP = "release_workspace"


def _start(services, tmp_path: Path) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    attempts, effects = tmp_path / "attempts.jsonl", tmp_path / "effects.jsonl"
    attempts.touch()
    effects.touch()
    Ensemble(services, tmp_path).start_services(
        "scheduler", "worker", "relay", "reconciler", LONGRUN_RUN_KINDS="tests.integration.cleanup_kinds:kinds",
        TIDY_ATTEMPTS=str(attempts), TIDY_EFFECTS=str(effects), LONGRUN_RECONCILE_INTERVAL="0.3")
    return attempts, effects


def _keyed(path: Path, key: str) -> list[dict[str, Any]]:
    return [line for line in map(json.loads, path.read_text().splitlines()) if line["key"] == key]


async def _run(engine, bus, goal: dict[str, Any], status: str) -> str:  # type: ignore[no-untyped-def]
    key = new_key()
    envelope = make("run.create", {"workflow": "tidy", "idempotency_key": key, "input": goal},
                    producer="tests", tenant_id="acme").model_dump(mode="json")
    await bus.publish(topology.INGRESS_EXCHANGE, "run.create", to_message(envelope, user_id=broker_user(bus.url)))
    run_id = str(await eventually(lambda: run_id_for(engine, "acme", key), what="the run"))
    await _until(engine, run_id, status)
    return run_id


async def _until(engine, run_id: str, status: str) -> None:  # type: ignore[no-untyped-def]
    async def there() -> bool:
        return await status_of(engine, run_id) == status

    await eventually(there, timeout=30, what=f"{run_id} {status}")


async def _cleanup_row(engine, run_id: str) -> Any:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT attempts, alerted, done_at, last_error FROM cleanups "
                                         "WHERE run_id = :r"), {"r": run_id})).first()


async def _cleaned(engine, run_id: str) -> None:  # type: ignore[no-untyped-def]
    async def done() -> bool:
        row = await _cleanup_row(engine, run_id)
        return row is not None and row.done_at is not None

    await eventually(done, timeout=30, what=f"{run_id} cleaned up")


async def _failing_gauge(engine, run_id: str) -> dict[str, int] | None:  # type: ignore[no-untyped-def]
    """``longrun_cleanups_failing`` by workflow, read while the run's cleanup is failing; None otherwise."""
    async with engine.connect() as plain:
        conn = await plain.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        async with conn.begin():
            row = (await conn.execute(text("SELECT alerted, done_at FROM cleanups WHERE run_id = :r"),
                                      {"r": run_id})).first()
            if row is None or not row.alerted or row.done_at is not None:
                return None
            return dict((await gauges.read(conn, silence_limits={}, tenants=False)).cleanups_failing)


async def _alerts(engine, run_id: str) -> list[tuple[str, dict[str, Any]]]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT action, details FROM audit_log WHERE target = :r "
                                       "AND action LIKE 'alert.%' ORDER BY id"), {"r": run_id})
        return [(r.action, dict(r.details)) for r in rows]


async def _cleanups_recorded(engine, run_id: str) -> list[tuple[str, str, int]]:  # type: ignore[no-untyped-def]
    return [(d["step"], d["outcome"], d["attempt"]) for t, d in await event_types(engine, run_id) if t == "run.cleanup"]


@pytest.mark.long
async def test_a_cleanup_failing_twice_then_succeeding_leaves_the_run_completed_with_one_alert_resolved(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given the services with the reconciler, and a run whose workspace release fails twice
    attempts, effects = _start(services, tmp_path)
    started = time.monotonic()
    run_id = await _run(engine, bus, {"fail_first": 2}, "COMPLETED")
    # While it fails, the database gauges count it (read in one snapshot with its row)
    assert (await eventually(lambda: _failing_gauge(engine, run_id), timeout=30, interval=0.05,
                             what="the cleanup failing")) == {"tidy": 1}
    # When its cleanup has run to the end
    await _cleaned(engine, run_id)
    # Then it took three attempts, retried with backoff (0.5 s, then 1 s) within seconds
    assert time.monotonic() - started < 20
    key = cleanup.key(run_id, STEP)
    assert len(_keyed(attempts, key)) == 3 and len(_keyed(effects, key)) == 1
    assert await _cleanups_recorded(engine, run_id) == [(STEP, "failed", 1), (STEP, "failed", 2), (STEP, "done", 3)]
    # and raised exactly one cleanup alert, resolved, while the run stayed COMPLETED
    alerts = await _alerts(engine, run_id)
    assert [action for action, _ in alerts] == ["alert.cleanup_failed", "alert.resolved"]
    assert alerts[1][1]["alert"] == "alert.cleanup_failed" and alerts[1][1]["attempt"] == 3
    assert await status_of(engine, run_id) == "COMPLETED"
    row = await _cleanup_row(engine, run_id)
    assert (row.attempts, row.alerted, row.last_error) == (3, True, None)
    async with engine.connect() as conn:
        ledger = (await conn.execute(text("SELECT logical_action, status, attempts, external_id, effect_kind "
                                          "FROM actions WHERE run_id = :r"), {"r": run_id})).all()
    assert [tuple(r) for r in ledger] == [(f"cleanup:{STEP}", "CONFIRMED", 3, f"released:ws-{run_id}",
                                            "non_idempotent_write")]


async def test_a_terminated_run_runs_no_cleanup_while_a_failed_and_a_cancelled_one_do(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given three runs of a kind with a cleanup: one that fails, two that wait
    attempts, effects = _start(services, tmp_path)
    failed = await _run(engine, bus, {"fail": True}, "FAILED")
    terminated = await _run(engine, bus, {"park": True}, "WAITING_EVENT")
    cancelled = await _run(engine, bus, {"park": True}, "WAITING_EVENT")
    # When an operator terminates one and then cancels the other
    async with engine.begin() as conn:
        await operate.terminate(PgTransaction(conn), terminated, actor="op", reason="runaway")
    async with engine.begin() as conn:
        await operate.cancel(PgTransaction(conn), cancelled, actor="op", reason="not needed")
    await _until(engine, cancelled, "CANCELLED")
    assert await status_of(engine, terminated) == "TERMINATED"
    # Then the failed and the cancelled runs released their workspaces, once each, and kept their ends
    await _cleaned(engine, failed)
    await _cleaned(engine, cancelled)
    for run_id, status in ((failed, "FAILED"), (cancelled, "CANCELLED")):
        assert len(_keyed(effects, cleanup.key(run_id, STEP))) == 1
        assert await _cleanups_recorded(engine, run_id) == [(STEP, "done", 1)]
        assert await status_of(engine, run_id) == status and await _alerts(engine, run_id) == []
    # and the terminated one, finished before the cancelled one was cleaned up, owes none and got none
    assert await _cleanup_row(engine, terminated) is None
    assert _keyed(attempts, cleanup.key(terminated, STEP)) == []
    assert await _cleanups_recorded(engine, terminated) == []

