"""Timer service: each due timer becomes its run event exactly once, whatever kills the service.

Runs are built through the domain events and ``longrun.db.runs`` (or, for the load test,
the same events folded and inserted in bulk), parked with ``timers.schedule_all`` of ``wait_timers``,
and fired by the real ``longrun.services.timer`` process, or by ``fire_due`` in-process where only
the use case's decision is under test. Every check reads PostgreSQL: run events, the
timers table, and the outbox rows the firing wrote.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Any, NamedTuple

import psycopg
import pytest
from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun.app import effects
from longrun.bus import topology
from longrun.db import outbox, runs, timers
from longrun.db.engine import psycopg_dsn
from longrun.db.schema import run_events
from longrun.db.schema import runs as runs_table
from longrun.domain import PinnedVersions, RunStatus, Usage, Wait, WakeReason, fold, freeze
from longrun.domain import events as ev
from longrun.domain.rate_limit import RATE_LIMIT_WAIT
from longrun.ports.runs import StoredRun, plan, wait_timers
from longrun.services.timer import batches as firing
from longrun.services.timer import main as timer_service
from longrun.services.timer import shortcut as timer_shortcut
from longrun.services.timer.batches import fire_due
from tests.fixtures import PARTITIONS, eventually
from tests.integration.admitted import admitted
from tests.integration.bus_helpers import scalar

pytestmark = pytest.mark.integration

TENANT = "tenant-timers"
VERSIONS = PinnedVersions(workflow="1", prompt="1", model_policy="1", tool_schemas="1")
BULK_RUNS = 10_000


def _created(run_id: str, at: float, tenant: str = TENANT, labels: dict[str, str] | None = None) -> ev.RunCreated:
    return ev.RunCreated(seq=1, at=at, run_id=run_id, tenant_id=tenant, kind="probe", goal=freeze({"n": 1}),
                         versions=VERSIONS, budget=Usage(model_calls=10, tool_calls=10, cost=1.0),
                         labels=freeze(labels or {}), correlation_id=f"corr-{run_id}")


async def _running(conn: AsyncConnection, run_id: str, tenant: str = TENANT,
                   labels: dict[str, str] | None = None) -> StoredRun:
    """A run created the way the scheduler creates it, then taken by a worker (READY -> RUNNING)."""
    at = time.time()
    stored = await runs.create(conn, _created(run_id, at, tenant, labels), idempotency_key=run_id, input_hash="h",
                               partition=topology.partition_of(run_id, PARTITIONS))
    assert stored is not None
    return await runs.append(conn, await admitted(conn, stored), [ev.RunStatusChanged(
        seq=stored.seq(1), at=at, to=RunStatus.RUNNING, reason="taken by test")])


async def _park(engine: AsyncEngine, run_id: str, status: RunStatus, wait: Wait, tenant: str = TENANT,
                labels: dict[str, str] | None = None) -> StoredRun:
    """RUNNING -> ``status`` with ``wait``, and its timers, in one transaction like a worker's commit."""
    async with engine.begin() as conn:
        stored = await _running(conn, run_id, tenant, labels)
        at = time.time()
        stored = await runs.append(conn, stored, [ev.WaitStarted(seq=stored.seq(1), at=at, status=status, wait=wait)])
        await timers.schedule_all(conn, wait_timers(stored.snapshot, decided_at=at))
    return stored


async def _park_for_retry(engine: AsyncEngine, run_id: str, *, in_seconds: float) -> str:
    wake_at = time.time() + in_seconds
    wait_id = f"retry-{uuid.uuid4().hex[:8]}"
    await _park(engine, run_id, RunStatus.RETRY_SCHEDULED,
                Wait(wait_id=wait_id, kind="timer", deadline=wake_at, wake_at=wake_at, subject="deploy"))
    return wait_id


async def _rows(engine: AsyncEngine, sql: str, **params: Any) -> list[Any]:
    async with engine.connect() as conn:
        return list(await conn.execute(text(sql), params))


async def _wokens(engine: AsyncEngine, run_id: str) -> list[Any]:
    return await _rows(engine, "SELECT data, applied FROM run_events WHERE run_id = :r AND type = 'run.woken' "
                               "ORDER BY seq", r=run_id)


class _Sent(NamedTuple):
    type: str
    payload: dict[str, Any]
    """The envelope published (``outbox.envelope_of``)."""


async def _outbox(engine: AsyncEngine, run_id: str) -> list[_Sent]:
    rows = await _rows(engine, "SELECT type, payload FROM outbox WHERE aggregate_id = :r ORDER BY id", r=run_id)
    return [_Sent(r.type, outbox.envelope_of(r.type, r.payload)) for r in rows]


async def _fired_at(engine: AsyncEngine, timer_key: str) -> Any:
    return (await _rows(engine, "SELECT fired_at FROM timers WHERE timer_key = :k", k=timer_key))[0].fired_at


async def test_a_due_retry_timer_wakes_its_run_exactly_once(clean, engine, services) -> None:
    # Given a run parked in RETRY_SCHEDULED whose backoff timer is due now
    wait_id = await _park_for_retry(engine, "run-retry", in_seconds=1.0)
    # When the timer service runs
    services.start("timer", "longrun.services.timer")
    await eventually(lambda: _fired_at(engine, f"run-retry:{wait_id}:wake"), what="the timer fired")
    # and keeps running for a few more polls
    await asyncio.sleep(1.5)
    # Then the run was woken once, by its timer, and one worker wakeup went out
    wokens = await _wokens(engine, "run-retry")
    assert [(w.data["wait_id"], w.data["reason"], w.applied) for w in wokens] == [(wait_id, "timer", True)]
    async with engine.connect() as conn:
        stored = await runs.load(conn, "run-retry")
    assert stored is not None and stored.snapshot.status is RunStatus.READY
    assert stored.snapshot.last_wake is not None and stored.snapshot.last_wake.reason is WakeReason.TIMER
    sent = await _outbox(engine, "run-retry")
    assert [o.payload["payload"]["reason"] for o in sent if o.type == "run.wakeup"] == ["timer:retry_backoff"]
    assert [o.payload["payload"]["status"] for o in sent if o.type == "run.event"] == ["READY"]


async def test_a_run_woken_from_a_wait_that_held_no_slot_is_queued_for_admission_not_sent_to_a_worker(
        clean, engine, infra, caplog) -> None:
    # Given a run that parked on its far side's rate limit, giving its tenant's slot back, its wake due now
    wake_at = time.time() + 0.2
    parked = await _park(engine, "run-limited", RunStatus.RETRY_SCHEDULED, Wait(
        wait_id="limited-1", kind=RATE_LIMIT_WAIT, deadline=wake_at + 60, wake_at=wake_at, correlation_key="forge"))
    assert not parked.admitted
    await asyncio.sleep(0.3)
    # and the scheduler's admission listening on its channel
    async with await psycopg.AsyncConnection.connect(psycopg_dsn(infra.database_url), autocommit=True) as listener:
        await listener.execute(f"LISTEN {effects.ADMISSION_CHANNEL}")
        # When its timer fires
        assert await fire_due(engine, batch=10, clock=time.time) == 1
        told = [n.payload async for n in listener.notifies(timeout=5, stop_after=1)]
    # Then the run is queued (ready, holding no slot), its wake and status broadcast on record, and
    # admission was told of its tenant; no worker was woken for it (a worker would refuse a queued run)
    async with engine.connect() as conn:
        stored = await runs.load(conn, "run-limited")
    assert stored is not None and stored.snapshot.status is RunStatus.READY and not stored.admitted
    assert [(w.data["wait_id"], w.applied) for w in await _wokens(engine, "run-limited")] == [("limited-1", True)]
    sent = await _outbox(engine, "run-limited")
    assert [o.type for o in sent] == ["run.event"]
    assert [o.payload["payload"]["status"] for o in sent] == ["READY"]
    assert told == [TENANT]
    # and the wake went the domain's way from the start (the short way sends every wake a wakeup)
    assert "shortcut disagrees" not in caplog.text


async def test_a_timer_service_killed_before_marking_fires_the_timer_once_after_restart(
        clean, engine, services) -> None:
    # Given a due retry timer
    wait_id = await _park_for_retry(engine, "run-crash", in_seconds=1.0)
    timer_key = f"run-crash:{wait_id}:wake"
    # When the timer service is SIGKILLed after writing the wake and the wakeup, before marking the timer
    crashing = services.start("timer", "longrun.services.timer", LONGRUN_CRASH_POINTS="timer.after_fire_before_mark")
    crashing.popen.wait(timeout=60)
    assert crashing.popen.returncode == -9, crashing.output()
    # Then the whole firing rolled back: no event, no wakeup, the timer still due
    assert await _wokens(engine, "run-crash") == []
    assert await _outbox(engine, "run-crash") == []
    assert await _fired_at(engine, timer_key) is None
    # And a restarted service fires it, once
    services.start("timer", "longrun.services.timer")
    await eventually(lambda: _fired_at(engine, timer_key), what="the timer fired after the restart")
    await asyncio.sleep(1.0)
    wokens = await _wokens(engine, "run-crash")
    assert [(w.data["wait_id"], w.applied) for w in wokens] == [(wait_id, True)]
    assert [o.type for o in await _outbox(engine, "run-crash")].count("run.wakeup") == 1
    assert await scalar(engine, "SELECT count(*) FROM timers WHERE fired_at IS NULL") == 0


async def test_a_deadline_for_a_wait_that_already_ended_is_cancelled_with_it_and_never_fires(
        clean, engine) -> None:
    # Given a run waiting for CI with a deadline, whose webhook arrived first
    deadline = time.time() + 0.3
    wait = Wait(wait_id="ci-1", kind="ci", deadline=deadline, correlation_key="ci:sha-1")
    stored = await _park(engine, "run-stale", RunStatus.WAITING_EVENT, wait)
    async with engine.begin() as conn:
        stored = await runs.append(conn, stored, [ev.RunWoken(seq=stored.seq(1), at=time.time(), wait_id="ci-1",
                                                              reason=WakeReason.EVENT, correlation_key="ci:sha-1")])
    assert stored.snapshot.status is RunStatus.READY
    outbox_before = await _outbox(engine, "run-stale")
    # Then the wake cancelled the wait's deadline timer in its own statement
    timer = (await _rows(engine, "SELECT fired_at, cancelled_at FROM timers WHERE timer_key = 'run-stale:ci-1:deadline'"))[0]
    assert timer.fired_at is None and timer.cancelled_at is not None
    # And when the deadline passes, nothing fires: no late wake, the run, its wakeups and broadcasts untouched
    await asyncio.sleep(max(0.0, deadline - time.time()) + 0.1)
    assert await fire_due(engine, batch=10, clock=time.time) == 0
    wokens = await _wokens(engine, "run-stale")
    assert [(w.data["reason"], w.applied) for w in wokens] == [("event", True)]
    async with engine.connect() as conn:
        after = await runs.load(conn, "run-stale")
    assert after is not None and after.snapshot == stored.snapshot and after.stored_seq == stored.stored_seq
    assert await _outbox(engine, "run-stale") == outbox_before
    assert await _fired_at(engine, "run-stale:ci-1:deadline") is None


async def test_a_wake_fired_the_short_way_cancels_its_waits_deadline_in_the_same_statement(
        clean, engine, monkeypatch) -> None:
    # Given a run waiting to retry, whose backoff is due now and whose deadline comes later
    now = time.time()
    await _park(engine, "run-two", RunStatus.RETRY_SCHEDULED,
                Wait(wait_id="r-2", kind="timer", deadline=now + 3600, wake_at=now - 1, subject="deploy"))
    written: list[int] = []
    real = timers.write_wakes

    async def noted(conn: Any, template: Any, wakes: Any, messages: Any, **kwargs: Any) -> None:
        written.append(len(wakes))
        await real(conn, template, wakes, messages, **kwargs)

    monkeypatch.setattr(timers, "write_wakes", noted)
    # When its backoff timer fires, the short way
    assert await fire_due(engine, batch=10, clock=time.time) == 1
    assert written == [1]
    # Then the wait ended by it took its deadline timer with it: cancelled, never to fire
    found = {r.timer_key: r for r in await _rows(engine, "SELECT timer_key, fired_at, cancelled_at FROM timers")}
    assert found["run-two:r-2:wake"].fired_at is not None and found["run-two:r-2:wake"].cancelled_at is None
    assert found["run-two:r-2:deadline"].fired_at is None and found["run-two:r-2:deadline"].cancelled_at is not None
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE timers SET wake_at = now() - interval '1 second'"))
    assert await fire_due(engine, batch=10, clock=time.time) == 0
    assert [(w.data["reason"], w.applied) for w in await _wokens(engine, "run-two")] == [("timer", True)]


async def test_a_timer_whose_run_another_transaction_holds_is_skipped_not_waited_for(clean, engine) -> None:
    # Given two runs whose backoff timers are due, one of them locked by a writer that has not committed
    waits = {run_id: await _park_for_retry(engine, run_id, in_seconds=3600) for run_id in ("run-held", "run-free")}
    async with engine.begin() as conn:
        # Due now; the ended waits' timers left open, as closure leaves one another timer replica had
        # claimed when its wait ended (it skips it rather than wait): they fire late
        await conn.execute(text("UPDATE timers SET wake_at = now() - interval '1 second', cancelled_at = NULL"))
    async with engine.connect() as writer:
        await writer.execute(text("SELECT 1 FROM runs WHERE run_id = 'run-held' FOR UPDATE"))
        # When a batch fires while the writer holds it
        fired = await asyncio.wait_for(fire_due(engine, batch=10, clock=time.time), timeout=5)
        # Then the free run was woken at once and the held one left unfired, without waiting for the writer
        assert fired == 1
        assert await _fired_at(engine, f"run-free:{waits['run-free']}:wake") is not None
        assert await _fired_at(engine, f"run-held:{waits['run-held']}:wake") is None
        await writer.rollback()
    # And the next batch, once the writer is gone, wakes it once
    assert await fire_due(engine, batch=10, clock=time.time) == 1
    assert [(w.data["wait_id"], w.applied) for w in await _wokens(engine, "run-held")] == [(waits["run-held"], True)]
    assert await fire_due(engine, batch=10, clock=time.time) == 0


async def test_run_level_timeouts_move_only_runs_they_still_describe(clean, engine) -> None:
    # Given an open waiting run and a finished run, both with a due business deadline
    await _park_for_retry(engine, "run-open", in_seconds=3600)
    async with engine.begin() as conn:
        done = await _running(conn, "run-done")
        await runs.append(conn, done, [ev.RunStatusChanged(seq=done.seq(1), at=time.time(), to=RunStatus.FAILED,
                                                           reason="gave up")])
        for run_id in ("run-open", "run-done"):
            await timers.schedule(conn, timer_key=f"{run_id}:business", run_id=run_id, kind="business_deadline",
                                  delay=-1, payload={})
    # When they fire
    assert await fire_due(engine, batch=10, clock=time.time) == 2
    # Then the open run cancels for its deadline (a worker is woken to carry the protocol out and end
    # it TIMED_OUT), naming the timer; the finished run got no event
    async with engine.connect() as conn:
        opened, finished = [await runs.load(conn, r) for r in ("run-open", "run-done")]
    assert opened is not None and opened.snapshot.status is RunStatus.CANCELLING and opened.snapshot.deadline_passed
    assert [o.type for o in await _outbox(engine, "run-open")][-2:] == ["run.wakeup", "run.event"]
    passed = await _rows(engine, "SELECT data->>'reason' AS reason FROM run_events "
                                 "WHERE run_id = 'run-open' AND type = 'run.deadline_passed'")
    assert [p.reason for p in passed] == ["business_deadline: the run's deadline passed"]
    # (created, taken, failed, and the run.summary its failure recorded)
    assert finished is not None and finished.snapshot.status is RunStatus.FAILED and finished.stored_seq == 4
    # and the cancelling run's retry timer was cancelled with its wait, in the same batch
    assert [(t.kind, t.fired_at is None, t.cancelled_at is not None) for t in await _rows(
        engine, "SELECT kind, fired_at, cancelled_at FROM timers WHERE run_id = 'run-open' ORDER BY kind")] == [
        ("business_deadline", False, False), ("retry_backoff", True, True)]


_BULK_WAITS = {
    "run-b-approval": (RunStatus.WAITING_USER, Wait(wait_id="a1", kind="approval", deadline=0, approval_id="ap-1",
                                                   owner="alice", approved_hash="h1", subject="merge")),
    "run-b-ci": (RunStatus.WAITING_EVENT, Wait(wait_id="c1", kind="ci", deadline=0, correlation_key="ci:b")),
    "run-b-ended": (RunStatus.WAITING_EVENT, Wait(wait_id="e1", kind="ci", deadline=0, correlation_key="ci:e")),
    "run-b-retry": (RunStatus.RETRY_SCHEDULED, Wait(wait_id="r1", kind="timer", deadline=0, wake_at=0,
                                                    subject="deploy")),
    "run-b-timed-out": (RunStatus.RETRY_SCHEDULED, Wait(wait_id="t1", kind="timer", deadline=0, wake_at=0)),
}


_BULK_TENANTS = ("tenant-red", "tenant-green", "tenant-blue")


@pytest.mark.parametrize("shortcut", [True, False], ids=["shortcut", "domain"])
async def test_wakes_fired_in_one_batch_write_exactly_what_the_domain_writes(
        clean, engine, monkeypatch, caplog, shortcut) -> None:
    # Given runs of several tenants, each with its own labels and correlation id, parked every way a
    # wait timer finds them: an approval and a CI wait reaching their deadlines, a retry backoff, a
    # wait a webhook already ended, and a run that timed out meanwhile
    later = time.time() + 3600
    before: dict[str, StoredRun] = {}
    for tenant in _BULK_TENANTS:
        for name, (status, wait) in _BULK_WAITS.items():
            moved = {"deadline": later, "wake_at": later} if wait.wake_at is not None else {"deadline": later}
            run_id = f"{name}-{tenant}"
            before[run_id] = await _park(engine, run_id, status, Wait(**{**_fields(wait), **moved}), tenant,
                                         {"team": tenant, "ticket": run_id})
    async with engine.begin() as conn:
        for tenant in _BULK_TENANTS:
            ended, out = before[f"run-b-ended-{tenant}"], before[f"run-b-timed-out-{tenant}"]
            before[f"run-b-ended-{tenant}"] = await runs.append(conn, ended, [ev.RunWoken(
                seq=ended.seq(1), at=time.time(), wait_id="e1", reason=WakeReason.EVENT, correlation_key="ci:e")])
            before[f"run-b-timed-out-{tenant}"] = await runs.append(conn, out, [ev.RunStatusChanged(
                seq=out.seq(1), at=time.time(), to=RunStatus.TIMED_OUT, reason="business_deadline: passed")])
        # Due now; the ended waits' timers left open, as closure leaves one another timer replica had
        # claimed when its wait ended (it skips it rather than wait): they fire late
        await conn.execute(text("UPDATE timers SET wake_at = now() - interval '1 second', cancelled_at = NULL"))
        due = {r.run_id: r for r in await conn.execute(text("SELECT timer_key, run_id, kind, payload FROM timers"))}
    if not shortcut:
        # Any difference from the sample's transition turns the shortcut off for the batch.
        monkeypatch.setattr(timer_shortcut, "_WAKE_KEYS", frozenset())
    # When they all fire in one batch
    at = time.time()
    assert await fire_due(engine, batch=len(before), clock=lambda: at) == len(before)
    assert ("shortcut disagrees" in caplog.text) is not shortcut
    # Then every run row, event and outbox message is what ports.runs.plan and effects make of the wake
    woken = 0
    for run_id, was in before.items():
        timer = due[run_id]
        event = ev.RunWoken(seq=was.seq(1), at=at, wait_id=timer.payload["wait_id"],
                            reason=WakeReason(timer.payload["reason"]))
        planned = plan(was, [event])
        applied = planned.after.snapshot.revision != was.snapshot.revision
        assert applied is run_id.startswith(("run-b-approval", "run-b-ci", "run-b-retry")), run_id
        row = (await _rows(engine, "SELECT * FROM runs WHERE run_id = :r", r=run_id))[0]._mapping
        expected = runs.projection(planned.after.snapshot)
        assert {k: row[k] for k in expected} == expected, run_id
        assert row["last_seq"] == planned.after.stored_seq
        stored = (await _rows(engine, "SELECT event_id, data, applied, occurred_at FROM run_events "
                                      "WHERE run_id = :r AND seq = :s", r=run_id, s=event.seq))
        assert [tuple(e) for e in stored] == [(f"{run_id}:{event.seq}", ev.event_to_dict(event), applied,
                                               datetime.fromtimestamp(at, UTC))], run_id
        messages = []
        if applied:
            messages.append(effects.wake_message(planned.after, reason=f"timer:{timer.kind}", producer="timer",
                                                 cause=f"timer:{timer.timer_key}"))
        broadcast = effects.broadcast_message(was.snapshot, planned.after, producer="timer",
                                              cause=f"timer:{timer.timer_key}")
        messages += [broadcast] if broadcast is not None else []
        sent = [{**o._mapping, "payload": outbox.envelope_of(o.type, o.payload)} for o in await _rows(
            engine, f"SELECT {', '.join(outbox.COLUMNS)} FROM outbox WHERE aggregate_id = :r ORDER BY id", r=run_id)]
        assert [_row_ids_dropped(o) for o in sent] == [_message_ids_dropped(m) for m in messages], run_id
        assert all(o["event_id"] == o["payload"]["event_id"] for o in sent), run_id
        # and each run's broadcast carries that run's own tenant, route, correlation, cause and labels
        for o in sent:
            if o["type"] != "run.event":
                continue
            woken += 1
            tenant = was.snapshot.tenant_id
            assert o["routing_key"] == f"{tenant}.run.status.ready", run_id
            assert {k: o["payload"][k] for k in ("tenant_id", "run_id", "correlation_id", "causation_id")} == {
                "tenant_id": tenant, "run_id": run_id, "correlation_id": f"corr-{run_id}",
                "causation_id": f"timer:{timer.timer_key}"}, run_id
            assert o["payload"]["payload"]["labels"] == {"team": tenant, "ticket": run_id}, run_id
    assert woken == 3 * len(_BULK_TENANTS)


async def test_a_wake_rendered_from_its_template_carries_any_text_verbatim(engine) -> None:
    # Given a template whose fixed text, and a wake whose own values, hold JSON's and format()'s metacharacters
    odd = 'a "quoted" 100% \\ %s %1$s \u00e9 value'
    template = timers.WakeTemplate(
        event={"type": "run.woken", "seq": 1, "wait_id": "w", "reason": "timer", "note": odd},
        patch={"status": "READY", "revision": 1, "last_seq": 1, "last_wake": {"wait_id": "w", "reason": "timer"},
               "note": odd})
    head = timers.RunHead(run_id=f"run {odd}", tenant_id=odd, partition=3, status="WAITING_EVENT", revision=7,
                          stored_seq=9, wait_id=odd, wait_has_timer=False, stage=odd, correlation_id=odd,
                          labels={odd: odd}, workflow=odd)
    wake = timers.Wake(head, wait_id=odd, reason="deadline", applies=True, timer_key=odd)
    # When PostgreSQL renders the wake
    async with engine.connect() as conn:
        rendered = await timers.render_wake(conn, template, wake)
    # Then every value is the wake's own, or the template's, character for character
    assert rendered.event == {"type": "run.woken", "seq": 10, "wait_id": odd, "reason": "deadline", "note": odd}
    assert rendered.patch == {"status": "READY", "revision": 8, "last_seq": 10,
                              "last_wake": {"wait_id": odd, "reason": "deadline"}, "note": odd}


def _fields(wait: Wait) -> dict[str, Any]:
    return {f: getattr(wait, f) for f in wait.__dataclass_fields__}


def _row_ids_dropped(row: dict[str, Any]) -> dict[str, Any]:
    return {**{k: v for k, v in row.items() if k != "event_id"}, "payload": _fresh_ids_dropped(row["payload"])}


def _message_ids_dropped(message: outbox.Message) -> dict[str, Any]:
    """The outbox row ``message`` makes, its payload the envelope published, minus its fresh ids."""
    envelope = message.envelope.model_dump(mode="json")
    return {"aggregate_type": "run", "aggregate_id": envelope["run_id"], "partition": message.partition,
            "exchange": message.exchange, "routing_key": message.routing_key, "type": envelope["type"],
            "traceparent": envelope["trace"], "payload": _fresh_ids_dropped(envelope)}


def _fresh_ids_dropped(envelope: dict[str, Any]) -> dict[str, Any]:
    """An envelope minus what differs between any two messages made for the same thing."""
    payload = {k: v for k, v in envelope["payload"].items() if k != "wakeup_id"}
    return {**{k: v for k, v in envelope.items() if k not in ("event_id", "occurred_at")}, "payload": payload}


@pytest.mark.timeout(240)
@pytest.mark.long
async def test_ten_thousand_timers_due_at_once_fire_exactly_once_across_two_replicas(
        clean, engine, services) -> None:
    # Given two timer service replicas, and 10,000 runs parked in RETRY_SCHEDULED
    replicas = [services.start("timer", "longrun.services.timer") for _ in range(2)]
    started = time.monotonic()
    await _insert_parked_runs(engine, BULK_RUNS)
    # When all their timers come due at the same instant (inserted with one statement)
    async with engine.begin() as conn:
        await conn.execute(text(
            "INSERT INTO timers (timer_key, run_id, kind, wake_at, payload) "
            "SELECT concat_ws(':', run_id, snapshot #>> '{wait,wait_id}', 'wake'), run_id, 'retry_backoff', "
            "       now() + interval '1 second', "
            "       jsonb_build_object('wait_id', snapshot #>> '{wait,wait_id}', 'reason', 'timer') "
            "FROM runs WHERE status = 'RETRY_SCHEDULED'"))
    setup = time.monotonic() - started
    committed_p99 = await _p99_committed(engine, BULK_RUNS, timeout=150)
    # Then every run was woken exactly once and one wakeup went out per run
    (p50, p99), worst = (await _rows(engine, """
        SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM fired_at - wake_at)),
               max(extract(epoch FROM fired_at - wake_at)) FROM timers"""))[0]
    print(f"\n{BULK_RUNS} timers, 2 replicas (setup {setup:.1f}s): lateness wake_at -> fired_at "
          f"p50 {p50:.2f}s p99 {p99:.2f}s max {float(worst):.2f}s; p99 until committed {committed_p99:.2f}s")
    counts = (await _rows(engine, """
        SELECT (SELECT count(*) FROM run_events WHERE type = 'run.woken' AND applied),
               (SELECT count(*) FROM run_events WHERE type = 'run.woken'),
               (SELECT count(DISTINCT run_id) FROM run_events WHERE type = 'run.woken'),
               (SELECT count(*) FROM outbox WHERE type = 'run.wakeup'),
               (SELECT count(DISTINCT aggregate_id) FROM outbox WHERE type = 'run.wakeup'),
               (SELECT count(*) FROM runs WHERE status = 'READY')"""))[0]
    assert tuple(counts) == (BULK_RUNS,) * 6
    assert not [p.name for p in replicas if "ERROR" in p.output() or "Traceback" in p.output()]
    # The lateness target (p99 <= 1 s) is measured by `make bench` on a quiet machine; here the
    # bound only catches a pathology (per-timer round trips, a stuck replica) under any load.
    assert p99 < 60.0


@pytest.mark.parametrize("seen_coming", [True, False], ids=["burst-seen", "trickle"])
async def test_a_whole_batch_coming_due_at_once_starts_every_lane_together(
        clean, engine, monkeypatch, seen_coming) -> None:
    # Given three batches' worth of timers set for one instant, a moment from now
    batch = 20
    await _insert_parked_runs(engine, 3 * batch)
    async with engine.begin() as conn:
        await conn.execute(text(
            "INSERT INTO timers (timer_key, run_id, kind, wake_at, payload) "
            "SELECT run_id || '.wake', run_id, 'retry_backoff', now() + interval '0.5 seconds', "
            "       jsonb_build_object('wait_id', snapshot #>> '{wait,wait_id}', 'reason', 'timer') FROM runs"))
    if not seen_coming:  # the loop does not know what is coming: the first batch fires alone
        real_next = firing.next_wakes

        async def unseen(engine: AsyncEngine, *, batch: int) -> timers.NextWakes:
            return timers.NextWakes((await real_next(engine, batch=batch)).first_in, None)
        monkeypatch.setattr(firing, "next_wakes", unseen)
    # and every batch noted when it started and ended, and how many it fired
    real_fire, calls = firing.fire_due, []

    async def noted(*args: Any, **kwargs: Any) -> int:
        started = time.monotonic()
        fired = await real_fire(*args, **kwargs)
        calls.append((started, time.monotonic(), fired))
        return fired
    monkeypatch.setattr(firing, "fire_due", noted)
    # When the timer loop runs until they all fired
    stopping = asyncio.Event()
    loop = asyncio.create_task(timer_service.fire_loop(engine, batch=batch, stopping=stopping))
    try:
        await eventually(lambda: _all_fired(engine), timeout=30, what="every timer fired")
    finally:
        stopping.set()
        await loop
    # Then, having seen a whole batch coming, the lanes started together: every other lane's batch
    # was in flight beside the first batch that fired anything. Trickling, that batch fired alone.
    # (A lane may fire nothing beside it: its transaction began a moment before the timers' instant,
    # or two lanes skipping each other's locked rows split one batch, leaving it the rest.)
    first = min(call for call in calls if call[2])
    beside = [call for call in calls if call is not first and call[0] < first[1] and call[1] > first[0]]
    assert (len(beside) >= timer_service.LANES - 1 if seen_coming else not beside), calls


async def _all_fired(engine: AsyncEngine) -> bool:
    return await scalar(engine, "SELECT count(*) FROM timers WHERE fired_at IS NULL") == 0


async def _insert_parked_runs(engine: AsyncEngine, n: int) -> None:
    """``n`` runs folded from RunCreated -> RUNNING -> WaitStarted(RETRY_SCHEDULED), inserted in bulk."""
    at = time.time()
    run_rows: list[dict[str, Any]] = []
    event_rows: list[dict[str, Any]] = []
    for i in range(n):
        run_id = f"run-bulk-{i:05d}"
        history = [
            _created(run_id, at),
            ev.RunStatusChanged(seq=2, at=at, to=RunStatus.RUNNING, reason="taken by test"),
            ev.WaitStarted(seq=3, at=at, status=RunStatus.RETRY_SCHEDULED,
                           wait=Wait(wait_id=f"w-{i}", kind="timer", deadline=at + 1, wake_at=at + 1)),
        ]
        snapshot = fold(history)
        run_rows.append({
            "run_id": run_id, "tenant_id": TENANT, "idempotency_key": run_id, "input_hash": "h",
            "workflow": "probe", "workflow_version": "1", "prompt_version": "1", "model_policy_version": "1",
            "tool_schema_version": "1", "partition": topology.partition_of(run_id, PARTITIONS), "last_seq": 3,
            "admitted_at": datetime.fromtimestamp(at, UTC), **runs.projection(snapshot)})
        event_rows += [{"run_id": run_id, "seq": e.seq, "event_id": f"{run_id}:{e.seq}", "type": e.type,
                        "data": ev.event_to_dict(e), "applied": True, "occurred_at": datetime.fromtimestamp(e.at, UTC)}
                       for e in history]
    for chunk in range(0, n, 2_500):
        async with engine.begin() as conn:
            await conn.execute(insert(runs_table), run_rows[chunk:chunk + 2_500])
            await conn.execute(insert(run_events), event_rows[3 * chunk:3 * (chunk + 2_500)])


async def _p99_committed(engine: AsyncEngine, n: int, *, timeout: float) -> float:
    """Seconds (database clock) from the timers' common wake_at until 99% of them were committed fired.

    ``fired_at`` is stamped when the batch marks its timers, before its commit; this polls what
    other sessions can see instead.
    """
    p99: float | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fired, since = (await _rows(engine, "SELECT count(fired_at), extract(epoch FROM now() - min(wake_at)) "
                                            "FROM timers"))[0]
        if p99 is None and fired >= 0.99 * n:
            p99 = float(since)
        if fired == n:
            assert p99 is not None
            return p99
        await asyncio.sleep(0.25)
    raise AssertionError(f"not all {n} timers fired within {timeout}s")
