"""Closure (seed 004 section 8): waits that end leave no timer to fire, a finished run leaves no timer
at all and records its run.summary, and the summary rides on the terminal broadcast's outcome."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.app.gateway import operate
from longrun.bus import topology
from longrun.db import leases, runs, timers
from longrun.db.transaction import PgTransaction
from longrun.domain import PinnedVersions, RunStatus, Usage, Wait, freeze
from longrun.domain import events as ev
from longrun.ports.runs import wait_timers
from longrun.services.timer import batches as firing
from tests.fixtures import PARTITIONS, eventually
from tests.integration.ensemble import Ensemble, goal, new_key, publish_create, run_id_for, status_of
from tests.integration.test_approval_binding import approval_requests, approve

pytestmark = pytest.mark.integration

VERSIONS = PinnedVersions(workflow="1", prompt="1", model_policy="1", tool_schemas="1")


async def _rows(engine: AsyncEngine, sql: str, **params: Any) -> list[Any]:
    async with engine.connect() as conn:
        return list(await conn.execute(text(sql), params))


async def _timers(engine: AsyncEngine, run_id: str) -> list[Any]:
    return await _rows(engine, "SELECT timer_key, kind, payload, fired_at, cancelled_at FROM timers "
                               "WHERE run_id = :r ORDER BY created_at, timer_key", r=run_id)


async def _late_wakes(engine: AsyncEngine, run_id: str) -> list[Any]:
    return await _rows(engine, "SELECT seq, data FROM run_events WHERE run_id = :r AND type = 'run.woken' "
                               "AND NOT applied", r=run_id)


async def _summary(engine: AsyncEngine, run_id: str) -> dict[str, Any]:
    rows = await _rows(engine, "SELECT data FROM run_events WHERE run_id = :r AND type = 'run.summary'", r=run_id)
    assert len(rows) == 1, rows
    return dict(rows[0].data["summary"])


async def _terminal_outcome(engine: AsyncEngine, run_id: str) -> dict[str, Any]:
    rows = await _rows(engine, "SELECT payload FROM outbox WHERE aggregate_id = :r AND type = 'run.event' "
                               "AND CAST(payload AS jsonb) -> 'payload' -> 'outcome' <> 'null'::jsonb", r=run_id)
    assert len(rows) == 1, rows
    envelope = rows[0].payload
    assert (envelope["schema_version"], envelope["data_class"]) == (3, "public")
    return dict(envelope["payload"]["outcome"])


async def _make_due_and_fire(engine: AsyncEngine, run_id: str) -> int:
    """Every timer of the run due now, and a batch fired: what a cancelled timer would do if it could."""
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE timers SET wake_at = now() - interval '1 second' WHERE run_id = :r"),
                           {"r": run_id})
    return await firing.fire_due(engine, batch=100, clock=time.time)


@pytest.mark.long
async def test_a_run_whose_waits_ended_by_their_events_leaves_no_timer_to_fire_and_is_summarized(
        clean, engine, bus, services, tmp_path) -> None:
    # Given the whole ensemble, the timer service included, and a run that waits for CI (a webhook)
    # and for an approval, each wait with its deadline timer
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_forge()
    ensemble.start_services("gateway", "scheduler", "worker", "relay", "timer")
    await ensemble.configure_forge()
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")  # the forge's webhooks are delivered once
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_=goal("closure"))
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
    asked = (await eventually(lambda: approval_requests(engine, run_id), timeout=60, what="approval asked"))[0]
    # When the approval is given and the run completes
    assert (await approve(ensemble, engine, run_id, asked)).status_code == 200
    await eventually(lambda: _is(engine, run_id, "COMPLETED"), timeout=60, what="completion")
    # Then every timer its waits scheduled was either fired by the wait it ended or cancelled by the event
    # that ended it; none is open, and the approval's deadline was cancelled, not fired
    found = await _timers(engine, run_id)
    assert found and all((t.fired_at is None) != (t.cancelled_at is None) for t in found), found
    approval_timers = [t for t in found if t.payload.get("wait_id") == _wait_id_of(asked)]
    assert approval_timers and all(t.cancelled_at is not None for t in approval_timers), found
    # and so was the deadline of every wait for CI, which the forge's webhook ended
    by_webhook = {r.data["wait_id"] for r in await _rows(
        engine, "SELECT data FROM run_events WHERE run_id = :r AND type = 'run.woken' AND applied "
                "AND data->>'reason' = 'event'", r=run_id)}
    assert by_webhook and {t.payload.get("wait_id") for t in found if t.cancelled_at is not None} >= by_webhook
    # and every write the run made answered in time: each call's start_to_close timer, scheduled with its
    # submission, was cancelled by its outcome's statement
    writes = {r.logical_action for r in await _rows(
        engine, "SELECT logical_action FROM actions WHERE run_id = :r AND effect_kind LIKE '%write'", r=run_id)}
    call_timers = [t for t in found if t.kind == "start_to_close"]
    assert writes and {t.payload["logical_action"] for t in call_timers} == writes
    assert all(t.cancelled_at is not None and t.fired_at is None for t in call_timers), call_timers
    # and when they all come due, none fires: no late wake on the timeline
    assert await _make_due_and_fire(engine, run_id) == 0
    await asyncio.sleep(1.5)  # the running timer service polls too
    assert all(t.fired_at is None for t in await _timers(engine, run_id) if t.cancelled_at is not None)
    assert await _late_wakes(engine, run_id) == []
    # and the run's summary names what it did (the far side's ids), what it used and how long it took
    summary = await _summary(engine, run_id)
    ledger = await _rows(engine, "SELECT logical_action, tool, external_id FROM actions WHERE run_id = :r "
                                 "AND status = 'CONFIRMED'", r=run_id)
    async with engine.connect() as conn:
        stored = await runs.load(conn, run_id)
    assert stored is not None
    run = stored.snapshot
    assert summary["status"] == "COMPLETED"
    assert sorted((d["logical_action"], d["tool"], d["external_id"]) for d in summary["done"]) == sorted(
        (r.logical_action, r.tool, r.external_id) for r in ledger)
    assert any(d["external_id"] for d in summary["done"])
    assert summary["used"] == {"model_calls": run.budget.used.model_calls,
                               "tool_calls": run.budget.used.tool_calls, "cost": run.budget.used.cost}
    assert summary["used"]["tool_calls"] > 0
    assert summary["duration_seconds"] == pytest.approx(run.status_since - run.created_at) and \
        summary["duration_seconds"] > 0
    # and the terminal broadcast's outcome carries it
    assert (await _terminal_outcome(engine, run_id))["summary"] == summary


def _wait_id_of(wait: dict[str, Any]) -> str:
    return str(wait["wait_id"])


async def _is(engine: AsyncEngine, run_id: str, status: str) -> bool:
    return await status_of(engine, run_id) == status


async def _parked_with_deadlines(engine: AsyncEngine, run_id: str) -> runs.StoredRun:
    """A run waiting for CI with a deadline (its timers scheduled as a worker does) and a business deadline."""
    at = time.time()
    created = ev.RunCreated(seq=1, at=at - 30, run_id=run_id, tenant_id="acme", kind="probe", goal=freeze({}),
                            versions=VERSIONS, budget=Usage(model_calls=5, tool_calls=5, cost=1.0))
    wait = Wait(wait_id="ci-1", kind="ci", deadline=at + 600, correlation_key=f"ci:{run_id}")
    async with engine.begin() as conn:
        stored = await runs.create(conn, created, idempotency_key=run_id, input_hash="h",
                                   partition=topology.partition_of(run_id, PARTITIONS))
        assert stored is not None
        stored = await runs.append(conn, stored, [
            ev.RunStatusChanged(seq=stored.seq(1), at=at, to=RunStatus.RUNNING, reason="taken"),
            ev.BudgetCharged(seq=stored.seq(2), at=at, model_calls=2, cost=0.125),
            ev.WaitStarted(seq=stored.seq(3), at=at, status=RunStatus.WAITING_EVENT, wait=wait)])
        await timers.schedule_all(conn, wait_timers(stored.snapshot, decided_at=at))
        await timers.schedule(conn, timer_key=f"{run_id}:business", run_id=run_id, kind="business_deadline",
                              delay=3600, payload={})
    return stored


async def test_a_terminated_run_has_no_outstanding_timer_nor_lease_and_its_summary_is_on_record(
        clean, engine) -> None:
    # Given a waiting run with a wait deadline and a business deadline pending, whose lease a worker holds
    run_id = "run-terminated"
    await _parked_with_deadlines(engine, run_id)
    assert len([t for t in await _timers(engine, run_id) if t.cancelled_at is None]) == 2
    async with engine.begin() as conn:
        fence = await leases.take_lease(conn, run_id, "worker-1", ttl=60)
    assert fence is not None
    # When an operator terminates it
    async with engine.begin() as conn:
        await operate.terminate(PgTransaction(conn), run_id, actor="op", reason="not needed")
    # Then its lease was released with it: the worker holding it is fenced out
    async with engine.connect() as conn:
        released = await runs.load(conn, run_id)
        assert not await leases.extend_lease(conn, run_id, fence, ttl=60)
    assert released is not None and (released.lease_owner, released.lease_until) == (None, None)
    # Then the termination cancelled every one of its timers in its own transaction, and none ever fires
    assert sorted((t.kind, t.fired_at, t.cancelled_at is not None) for t in await _timers(engine, run_id)) == [
        ("business_deadline", None, True), ("wait_deadline", None, True)]
    assert await _make_due_and_fire(engine, run_id) == 0
    assert await _late_wakes(engine, run_id) == []
    # and its summary says how it ended, what it used and how long it ran
    async with engine.connect() as conn:
        stored = await runs.load(conn, run_id)
    assert stored is not None and stored.snapshot.status is RunStatus.TERMINATED
    summary = await _summary(engine, run_id)
    assert summary == {"status": "TERMINATED", "terminal_reason": "terminated by op: not needed", "done": [],
                       "used": {"model_calls": 2, "tool_calls": 0, "cost": 0.125},
                       "duration_seconds": pytest.approx(stored.snapshot.status_since - stored.snapshot.created_at)}
    assert summary["duration_seconds"] >= 30
    assert (await _terminal_outcome(engine, run_id))["summary"] == summary


async def test_a_business_deadline_sends_the_run_cancelling_and_cancels_its_wait_timers(clean, engine) -> None:
    # Given a waiting run whose business deadline comes due first
    run_id = "run-deadline"
    await _parked_with_deadlines(engine, run_id)
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE timers SET wake_at = now() - interval '1 second' "
                                "WHERE kind = 'business_deadline'"))
    # When the timer service fires it
    assert await firing.fire_due(engine, batch=10, clock=time.time) == 1
    # Then the run cancels for its deadline (a worker ends it TIMED_OUT once its actions are settled) and
    # the wait it left behind had its deadline cancelled in that batch
    found = {t.kind: t for t in await _timers(engine, run_id)}
    assert found["business_deadline"].fired_at is not None and found["business_deadline"].cancelled_at is None
    assert found["wait_deadline"].fired_at is None and found["wait_deadline"].cancelled_at is not None
    async with engine.connect() as conn:
        stored = await runs.load(conn, run_id)
    assert stored is not None and stored.snapshot.status is RunStatus.CANCELLING and stored.snapshot.wait is None
    assert await _make_due_and_fire(engine, run_id) == 0
    assert await _late_wakes(engine, run_id) == []
