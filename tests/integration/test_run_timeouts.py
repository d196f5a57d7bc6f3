"""Run-level timeouts through the real services: schedule-to-start ends a run no worker starts and
leaves nothing behind for one that is started; a business deadline cancels in-flight work by the
cancel protocol and ends the run TIMED_OUT (an operator cannot cancel it a second time);
run.create v3 and v4 reach the snapshot with the run kind's defaults filled in.

The run kind is ``tests/integration/timed_kinds.py``: its far side is a file with one line per call
or compensation that reached it.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from longrun.app.gateway import operate
from longrun.bus import topology
from longrun.bus.codec import broker_user, to_message
from longrun.db import runs
from longrun.db.transaction import PgTransaction
from longrun.domain import PinnedVersions, RunTimeouts, Usage, freeze
from longrun.domain import events as ev
from longrun.envelope import make
from longrun.errors import IllegalTransition
from longrun.services.timer import batches as firing
from tests.fixtures import PARTITIONS, eventually
from tests.integration.ensemble import Ensemble, event_types, new_key, run_id_for, status_of
from tests.integration.timed_kinds import DEFAULTS

pytestmark = pytest.mark.integration

KINDS = "tests.integration.timed_kinds:kinds"
VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="timed-1")
MODULES = {"scheduler": "longrun.services.scheduler", "worker": "longrun.services.worker", "relay": "longrun.services.outbox_relay",
           "timer": "longrun.services.timer"}


def _start(services, tmp_path: Path, *names: str, slow: float = 0.0) -> Path:  # type: ignore[no-untyped-def]
    calls = tmp_path / "far-side.jsonl"
    calls.touch()
    ensemble = Ensemble(services, tmp_path)
    for name in names:
        ensemble.start(name, MODULES[name], LONGRUN_RUN_KINDS=KINDS, TIMED_CALLS=str(calls),
                       TIMED_SLOW_SECONDS=str(slow))
    return calls


def _far_side(calls: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in calls.read_text().splitlines()]


async def _create(bus, goal: dict[str, Any], *, version: int = 4, **fields: Any) -> str:  # type: ignore[no-untyped-def]
    """A run.create as a producer sends it: the newest version, or v3 (no timeouts) on the wire."""
    key = new_key()
    envelope = make("run.create", {"workflow": "timed", "idempotency_key": key, "input": goal, **fields},
                    producer="tests", tenant_id="acme").model_dump(mode="json")
    if version == 3:
        assert "timeouts" not in fields
        del envelope["payload"]["timeouts"]
        envelope["schema_version"] = 3
    assert envelope["schema_version"] == version
    await bus.publish(topology.INGRESS_EXCHANGE, "run.create", to_message(envelope, user_id=broker_user(bus.url)))
    return key


async def _run_in(engine, key: str, status: str, *, timeout: float = 30) -> str:  # type: ignore[no-untyped-def]
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")

    async def there() -> bool:
        return await status_of(engine, run_id) == status

    await eventually(there, timeout=timeout, what=f"{run_id} {status}")
    return str(run_id)


async def _snapshot(engine, run_id: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT snapshot FROM runs WHERE run_id = :r"), {"r": run_id})).scalar_one()


async def _queue_timers(engine, run_id: str) -> list[Any]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return list(await conn.execute(text(
            "SELECT timer_key, payload, fired_at, cancelled_at FROM timers "
            "WHERE run_id = :r AND kind = 'schedule_to_start' ORDER BY created_at"), {"r": run_id}))


async def test_a_run_no_worker_starts_in_time_ends_timed_out_by_schedule_to_start(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given the services but no worker, and a run that may sit queued one second
    calls = _start(services, tmp_path, "scheduler", "relay", "timer")
    key = await _create(bus, {"calls": ["book"]}, timeouts={"schedule_to_start": 1})
    run_id = await _run_in(engine, key, "READY")
    # When nobody starts it, the timer service ends it TIMED_OUT once that second has passed
    started = time.monotonic()
    await _run_in(engine, key, "TIMED_OUT")
    assert time.monotonic() - started < 15
    changes = [d for t, d in await event_types(engine, run_id) if t == "run.status_changed"]
    assert [(c["from"] if "from" in c else None, c["to"]) for c in changes][-1][1] == "TIMED_OUT"
    assert changes[-1]["reason"].startswith("schedule_to_start:")
    # naming the queue stint it timed (the run's creation, revision 1), fired once; nothing was called
    [timer] = await _queue_timers(engine, run_id)
    assert (timer.timer_key, timer.payload) == (f"{run_id}:schedule_to_start:1", {"revision": 1})
    assert timer.fired_at is not None and timer.cancelled_at is None
    assert _far_side(calls) == []


async def test_a_run_started_in_time_leaves_no_queue_timer_to_fire_each_time_it_is_queued(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given the whole ensemble, and a run that is queued twice (created, then woken by its wait's
    # deadline) and then parks for an hour: it stays open, so nothing but the takes cancelled its timers
    calls = _start(services, tmp_path, "scheduler", "relay", "timer", "worker")
    key = await _create(bus, {"calls": ["book"], "nap": True, "park": True}, timeouts={"schedule_to_start": 30})
    run_id = await _run_in(engine, key, "WAITING_EVENT")
    await eventually(lambda: _booked(calls), what="the booking")
    await _run_in(engine, key, "WAITING_EVENT")
    # Then each queue stint had its timer, and the take that started it cancelled it: none fired
    found = await _queue_timers(engine, run_id)
    assert len(found) == 2 and found[0].payload == {"revision": 1} and found[1].payload["revision"] > 1
    assert [(t.fired_at, t.cancelled_at is not None) for t in found] == [(None, True), (None, True)]
    woken = [d for t, d in await event_types(engine, run_id) if t == "run.woken"]
    assert [w["reason"] for w in woken] == ["deadline"]
    assert [c["tool"] for c in _far_side(calls)] == ["timed.book"]


async def _booked(calls: Path) -> bool:
    return bool(_far_side(calls))


async def test_create_v3_and_v4_timeouts_reach_the_snapshot_with_the_kinds_defaults(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given the scheduler alone (the runs stay queued)
    _start(services, tmp_path, "scheduler")
    # When a v3 producer creates a run (it cannot say timeouts) and a v4 one sets a start-to-close only
    old = await _run_in(engine, await _create(bus, {"calls": []}, version=3), "READY")
    new = await _run_in(engine, await _create(bus, {"calls": []}, timeouts={"start_to_close": 1.5}), "READY")
    # Then the v3 run has its kind's defaults and the v4 run its own cap, the rest from its kind
    assert (await _snapshot(engine, old))["timeouts"] == {"schedule_to_start": DEFAULTS.schedule_to_start,
                                                          "start_to_close": None}
    assert (await _snapshot(engine, new))["timeouts"] == {"schedule_to_start": DEFAULTS.schedule_to_start,
                                                          "start_to_close": 1.5}
    created = [d for t, d in await event_types(engine, new) if t == "run.created"][0]
    assert RunTimeouts(**created["timeouts"]) == RunTimeouts(schedule_to_start=600.0, start_to_close=1.5)
    # and the runs column that keeps the take free for runs without one holds the kind's default
    async with engine.connect() as conn:
        kept = (await conn.execute(text("SELECT schedule_to_start FROM runs WHERE run_id IN (:a, :b)"),
                                   {"a": old, "b": new})).scalars().all()
    assert kept == [600.0, 600.0]


@pytest.mark.long
async def test_a_business_deadline_cancels_in_flight_work_compensates_and_ends_timed_out(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given a run that books (a write with a compensation), makes a slow call (4 s) and then notes,
    # with a business deadline 2 s away: the deadline passes while the slow call is in flight
    calls = _start(services, tmp_path, "scheduler", "relay", "timer", "worker", slow=4.0)
    await _run_in(engine, await _create(bus, {"calls": []}), "COMPLETED")  # the services are up
    deadline = datetime.now(UTC) + timedelta(seconds=2)
    key = await _create(bus, {"calls": ["book", "slow", "note"]}, deadline=deadline.isoformat())
    run_id = await _run_in(engine, key, "TIMED_OUT")
    history = await event_types(engine, run_id)
    types = [t for t, _ in history]
    # Then the run entered the cancel protocol for its deadline while the slow call was in flight:
    passed = types.index("run.deadline_passed")
    assert types.index("action.submitted", types.index("action.confirmed")) < passed < len(types) - 1
    # the in-flight call finished and was recorded, no new action started, the booking was compensated
    after = history[passed + 1:]
    assert [d["logical_action"] for t, d in after if t == "action.confirmed"] == ["slow"]
    assert [t for t, _ in after if t in ("action.prepared", "action.recorded")] == []
    assert [(t, d["logical_action"]) for t, d in after if t.startswith("action.compens")] == [
        ("action.compensation_started", "book"), ("action.compensated", "book")]
    # and it ended TIMED_OUT (not CANCELLED), the summary saying so
    end = [d for t, d in history if t == "run.status_changed"][-1]
    assert end["to"] == "TIMED_OUT" and end["reason"].startswith("business_deadline:")
    summary = [d for t, d in history if t == "run.summary"][0]["summary"]
    assert summary["status"] == "TIMED_OUT"
    assert {(a["logical_action"], a["status"]) for a in summary["done"]} == {("book", "COMPENSATED"),
                                                                             ("slow", "CONFIRMED")}
    # One effect per key at the far side: the booking, the slow call, the booking's cancellation; the
    # note it would have made next was never started
    effects = _far_side(calls)
    assert Counter(e["tool"] for e in effects) == {"timed.book": 1, "timed.slow": 1, "timed.book.compensate": 1}
    assert len({(e["tool"], e["key"]) for e in effects}) == 3
    booked = next(e["key"] for e in effects if e["tool"] == "timed.book")
    assert next(e["key"] for e in effects if e["tool"] == "timed.book.compensate") == booked


async def test_an_operators_cancel_of_a_run_cancelling_for_its_deadline_is_refused_naming_why(
        clean, engine) -> None:  # type: ignore[no-untyped-def]
    # Given a run whose deadline had passed when it was created: the timer service sends it cancelling
    at = time.time()
    created = ev.RunCreated(seq=1, at=at, run_id="run-late", tenant_id="acme", kind="timed", goal=freeze({}),
                            versions=VERSIONS, budget=Usage(model_calls=1, tool_calls=1, cost=1.0), deadline=at - 1)
    async with engine.begin() as conn:
        assert await runs.create(conn, created, idempotency_key="late", input_hash="h",
                                 partition=topology.partition_of("run-late", PARTITIONS)) is not None
    assert await firing.fire_due(engine, batch=10, clock=time.time) == 1
    # When an operator cancels it too
    async with engine.begin() as conn:
        with pytest.raises(IllegalTransition) as refused:
            await operate.cancel(PgTransaction(conn), "run-late", actor="op", reason="stop it")
    # Then the cancel is refused, naming both states and why; the run keeps its deadline's TIMED_OUT end
    assert str(refused.value).endswith("illegal run transition CANCELLING -> CANCELLING: the run is already "
                                       "cancelling for its business deadline and ends TIMED_OUT once its "
                                       "actions settle")
    async with engine.connect() as conn:
        stored = await runs.load(conn, "run-late")
        audited = (await conn.execute(text("SELECT count(*) FROM audit_log WHERE target = 'run-late'"))).scalar()
    assert stored is not None and stored.snapshot.status.value == "CANCELLING" and stored.snapshot.deadline_passed
    assert audited == 0
