"""A tool call's durable timers, fired by the timer service's domain path (``fire_due`` in-process):
a write given up on is UNKNOWN for the reconciler, a pure or read call is retried under its
policy, and a timer whose attempt is over changes nothing. Every check reads PostgreSQL."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun.app.gateway import webhooks
from longrun.artifacts import FilesystemArtifactStore
from longrun.bus import topology
from longrun.db import actions as ledger
from longrun.db import leases
from longrun.db import runs, timers
from longrun.db.driver import Pool
from longrun.db.worker_store import PgWorkerStore
from longrun.domain import ActionStatus, EffectKind, PinnedVersions, RetryPolicy, RunStatus, Usage, calls, freeze
from longrun.domain import events as ev
from longrun.ports.runs import Fence, LedgerRequest, StoredRun
from longrun.services.timer.batches import fire_due
from tests.fixtures import PARTITIONS

pytestmark = pytest.mark.integration

VERSIONS = PinnedVersions(workflow="1", prompt="1", model_policy="1", tool_schemas="1")


async def _calling(conn: AsyncConnection, run_id: str, effect: EffectKind, *,
                   heartbeat_timeout: float | None = None) -> tuple[StoredRun, Fence]:
    """A run taken by a worker whose call ``work`` is submitted and on record, with its timers due now."""
    at = time.time()
    created = ev.RunCreated(seq=1, at=at, run_id=run_id, tenant_id="tenant-calls", kind="probe",
                            goal=freeze({}), versions=VERSIONS, budget=Usage(model_calls=9, tool_calls=9, cost=1.0))
    stored = await runs.create(conn, created, idempotency_key=run_id, input_hash="h",
                               partition=topology.partition_of(run_id, PARTITIONS))
    assert stored is not None
    fence = await leases.take_lease(conn, run_id, "worker-1", ttl=600)
    assert fence is not None
    key = f"key-{run_id}"
    request = {"logical_action": "work", "tool": "probe.work", "tool_version": "1", "effect_kind": effect,
               "idempotency_key": key, "request_hash": "h"}
    stored = await runs.append(conn, stored, [
        ev.RunStatusChanged(seq=stored.seq(1), at=at, to=RunStatus.RUNNING, reason="taken"),
        ev.ActionPrepared(seq=stored.seq(2), at=at, **request),  # type: ignore[arg-type]
        ev.ActionSubmitted(seq=stored.seq(3), at=at, logical_action="work")])
    await ledger.prepare(conn, action_id=str(uuid.uuid4()), run_id=run_id, request={}, fencing_token=fence.token,
                         **{**request, "effect_kind": effect.value})
    for timer in calls.call_timers(run_id, "work", token=fence.token, start_to_close=5,
                                   heartbeat_timeout=heartbeat_timeout):
        await timers.schedule(conn, run_id=run_id, **{**timer, "delay": -1 if timer["kind"] == "start_to_close"
                                                      or heartbeat_timeout is None else -0.5})
    return stored, fence


async def _rows(engine: AsyncEngine, sql: str, **params: Any) -> list[Any]:
    async with engine.connect() as conn:
        return list(await conn.execute(text(sql), params))


async def _events(engine: AsyncEngine, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [(r.type, r.data) for r in await _rows(
        engine, "SELECT type, data FROM run_events WHERE run_id = :r AND seq > 4 ORDER BY seq", r=run_id)]


async def test_a_write_given_up_on_by_start_to_close_is_unknown_and_its_worker_fenced_out(clean, engine) -> None:
    # Given a write submitted under a live lease, its start_to_close timer due
    async with engine.begin() as conn:
        _, fence = await _calling(conn, "run-write", EffectKind.NON_IDEMPOTENT_WRITE)
    # When the timer service fires it
    assert await fire_due(engine, batch=10, clock=time.time) == 1
    # Then the action is UNKNOWN on the run and the ledger, the run parked for the reconciler,
    # and the lease released: the worker holding it writes nothing more
    async with engine.connect() as conn:
        stored = await runs.load(conn, "run-write")
        row = await ledger.get(conn, "key-run-write")
    assert stored is not None and stored.snapshot.status is RunStatus.ACTION_UNKNOWN and stored.lease_owner is None
    assert row is not None and row.status == ActionStatus.UNKNOWN.value
    events = await _events(engine, "run-write")
    assert [t for t, _ in events] == ["action.unknown", "run.status_changed"]
    assert events[0][1]["cause"] == f"start_to_close: no answer within 5s (lease {fence.token})"
    assert events[1][1]["reason"].startswith("work: outcome unknown (start_to_close:")
    assert await _rows(engine, "SELECT 1 FROM timers WHERE run_id = 'run-write' AND fired_at IS NULL "
                               "AND cancelled_at IS NULL") == []


async def test_a_read_whose_heartbeats_stopped_is_retried_under_its_policy(clean, engine) -> None:
    # Given a read call (declaring a heartbeat timeout) whose heartbeat timer is due
    async with engine.begin() as conn:
        await _calling(conn, "run-read", EffectKind.READ, heartbeat_timeout=2)
        await conn.execute(text("UPDATE timers SET wake_at = now() + interval '1 hour' "
                                "WHERE run_id = 'run-read' AND kind = 'start_to_close'"))
    # When the timer service fires it
    assert await fire_due(engine, batch=10, clock=time.time,
                          retry=RetryPolicy(initial_interval=30, maximum_interval=30, jitter=0)) == 1
    # Then the action is RETRYABLE, the run waits for its retry on a durable timer, the lease is
    # released, and the call's start_to_close timer was cancelled with it
    async with engine.connect() as conn:
        stored = await runs.load(conn, "run-read")
        row = await ledger.get(conn, "key-run-read")
    assert stored is not None and stored.snapshot.status is RunStatus.RETRY_SCHEDULED and stored.lease_owner is None
    assert row is not None and row.status == ActionStatus.RETRYABLE.value
    events = await _events(engine, "run-read")
    assert [t for t, _ in events] == ["action.unavailable", "run.wait_started"]
    assert events[0][1]["cause"].startswith("heartbeat: no heartbeat within 2s")
    timers_left = {(r.kind, r.fired_at is not None, r.cancelled_at is not None, round(r.due_in))
                   for r in await _rows(engine, "SELECT kind, fired_at, cancelled_at, "
                                                "extract(epoch FROM wake_at - now()) AS due_in "
                                                "FROM timers WHERE run_id = 'run-read'")}
    assert {(k, f, c) for k, f, c, _ in timers_left} == {("heartbeat", True, False),
                                                         ("start_to_close", False, True),
                                                         ("retry_backoff", False, False)}
    assert next(d for k, _, _, d in timers_left if k == "retry_backoff") == 30


async def test_a_call_timer_whose_attempt_is_over_changes_nothing(clean, engine) -> None:
    # Given one call taken over by another worker (a new token) and one that answered meanwhile
    async with engine.begin() as conn:
        await _calling(conn, "run-taken", EffectKind.IDEMPOTENT_WRITE)
        await conn.execute(text("UPDATE runs SET lease_until = now() - interval '1 second' "
                                "WHERE run_id = 'run-taken'"))
        assert await leases.take_lease(conn, "run-taken", "worker-2", ttl=600) is not None
        answered, fence = await _calling(conn, "run-answered", EffectKind.IDEMPOTENT_WRITE)
        await runs.append(conn, answered, [ev.ActionConfirmed(seq=answered.seq(1), at=time.time(),
                                                              logical_action="work")], fence=fence)
        # (the outcome's statement cancelled the answered call's timer)
        assert [r.cancelled_at is not None for r in await conn.execute(text(
            "SELECT cancelled_at FROM timers WHERE run_id = 'run-answered'"))] == [True]
    # When the timer service runs
    assert await fire_due(engine, batch=10, clock=time.time) == 1
    # Then the taken-over run's stale timer fired without an event, and the answered run's never fired
    assert await _events(engine, "run-taken") == []
    assert [t for t, _ in await _events(engine, "run-answered")] == ["action.confirmed"]
    assert [r.fired_at is None for r in await _rows(
        engine, "SELECT fired_at FROM timers WHERE run_id = 'run-answered'")] == [True]


async def test_a_heartbeat_moves_only_its_own_attempt_s_timer_and_a_resend_replaces_the_attempt_s_timers(
        clean, engine, tmp_path) -> None:
    # Given a read (declaring a heartbeat timeout) submitted under a worker's lease
    async with engine.begin() as conn:
        _, fence = await _calling(conn, "run-beat", EffectKind.READ, heartbeat_timeout=2)
        await conn.execute(text("UPDATE timers SET wake_at = now() + interval '1 hour' WHERE run_id = 'run-beat'"))
    statements = Pool(engine.url.render_as_string(hide_password=False), size=2)
    await statements.open()
    store = PgWorkerStore(engine=engine, statements=statements, artifacts=FilesystemArtifactStore(tmp_path),
                          match_kept=webhooks.match_kept)
    heartbeat_key = calls.call_timer_key("run-beat", "work", fence.token, calls.HEARTBEAT)
    try:
        # When the call heartbeats, its progress lands on its row and its heartbeat timer moves to 3 s from now
        assert await store.beat("key-run-beat", fence.token, {"done": 1, "of": 3}, timer_key=heartbeat_key,
                                due_in=3)
        row = (await _rows(engine, "SELECT progress, heartbeat_at FROM actions WHERE run_id = 'run-beat'"))[0]
        assert row.progress == {"done": 1, "of": 3} and row.heartbeat_at is not None
        due = {r.kind: round(r.due_in) for r in await _rows(
            engine, "SELECT kind, extract(epoch FROM wake_at - now()) AS due_in FROM timers WHERE run_id = 'run-beat'")}
        assert due == {"heartbeat": 3, "start_to_close": 3600}
        # and a heartbeat under another token is refused, writing nothing
        assert not await store.beat("key-run-beat", fence.token + 1, {"done": 2}, timer_key=heartbeat_key, due_in=3)
        # When another worker takes the run over and sends the call again
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE runs SET lease_until = now() - interval '1 second' "
                                    "WHERE run_id = 'run-beat'"))
            taken = await leases.take_lease(conn, "run-beat", "worker-2", ttl=600)
        assert taken is not None
        attempt = LedgerRequest(action_id=str(uuid.uuid4()), run_id="run-beat", logical_action="work",
                                tool="probe.work", tool_version="1", effect_kind="read",
                                idempotency_key="key-run-beat", request_hash="h", request={},
                                fencing_token=taken.token)
        await store.resend("run-beat", taken, 600, attempt, calls.call_timers(
            "run-beat", "work", token=taken.token, start_to_close=5, heartbeat_timeout=2))
    finally:
        await statements.close()
    # Then the first attempt's timers are cancelled and the new attempt has its own
    found = {(r.payload["fencing_token"], r.kind, r.cancelled_at is not None) for r in await _rows(
        engine, "SELECT kind, payload, cancelled_at FROM timers WHERE run_id = 'run-beat'")}
    assert found == {(fence.token, "start_to_close", True), (fence.token, "heartbeat", True),
                     (taken.token, "start_to_close", False), (taken.token, "heartbeat", False)}
    row = (await _rows(engine, "SELECT attempts, fencing_token, progress FROM actions WHERE run_id = 'run-beat'"))[0]
    assert (row.attempts, row.fencing_token, row.progress) == (2, taken.token, {"done": 1, "of": 3})
