"""Retention on real PostgreSQL: with short horizons every growing table keeps only what its horizon
keeps, finished runs are archived to the artifact store and stay findable as tombstones, open runs are
never touched, and a quarantine replay older than the inbox horizon repeats no effect."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import insert, text
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun.app import effects
from longrun.app.reconciler.cleanup import clean_up
from longrun.app.scheduler import admit
from longrun.artifacts import RUNTIME, FilesystemArtifactStore
from longrun.bus import topology
from longrun.bus.codec import broker_user, to_message
from longrun.config import Settings
from longrun.db import actions as ledger
from longrun.db import inbox, membership, outbox, quarantine, run_batches, runs, timers
from longrun.db.artifacts import RecordedUploads
from longrun.db.audit import audit
from longrun.db.cleanups import PgCleanupStore
from longrun.db.schema import actions as actions_table
from longrun.db.transaction import PgTransaction
from longrun.domain import ActionStatus, EffectKind, RunStatus, Usage, fold, freeze, idempotency_key, request_hash
from longrun.domain import events as ev
from longrun.envelope import Envelope, make
from longrun.ports.runs import LedgerRequest, StoredRun, plan
from longrun.ports.webhooks import Translated
from longrun.workflows import STEPS_VERSIONS, steps
from longrun.services.gateway import quarantine as quarantine_ops
from longrun.services.reconciler import retention
from longrun.services.reconciler.sweeps import horizons
from tests.fixtures import PARTITIONS, eventually
from tests.integration.ensemble import Ensemble, run_id_for, status_of
from tests.integration.identities import bearer
from tests.kinds import registry

pytestmark = pytest.mark.integration

FINISHED = 10_000
OPEN = 50
HORIZON = "4s"
LANES = 8
CHUNK = 125
SHORT = {"LONGRUN_RETAIN_OUTBOX": HORIZON, "LONGRUN_RETAIN_INBOX": HORIZON,
         "LONGRUN_QUARANTINE_REPLAY_WINDOW": "3s", "LONGRUN_RETAIN_TIMERS": HORIZON,
         "LONGRUN_RETAIN_WEBHOOK_EVENTS": HORIZON, "LONGRUN_RETAIN_UNMATCHED_WEBHOOK_EVENTS": HORIZON,
         "LONGRUN_RETAIN_DELIVERY_FAILURES": HORIZON,
         "LONGRUN_RETAIN_REPLAYED_QUARANTINE": HORIZON, "LONGRUN_RETAIN_DEAD_MEMBERS": HORIZON,
         "LONGRUN_RETAIN_AUDIT": HORIZON, "LONGRUN_RETAIN_FINISHED_RUNS": HORIZON,
         "LONGRUN_ARTIFACT_ORPHAN_GRACE": HORIZON}
ECHO = {"step": 0}


def _create_envelope(tenant: str, key: str, n: int) -> Envelope:
    return make("run.create", {"workflow": steps.KIND, "idempotency_key": key, "input": {"steps": 1, "n": n}},
                producer="tests", tenant_id=tenant)


async def _created(conn: AsyncConnection, envelope: Envelope) -> StoredRun:
    """The run a create makes, written by the store's creating statement, announced as the scheduler does."""
    run_id = f"run-{uuid.uuid4()}"
    partition = topology.partition_of(run_id, PARTITIONS)
    created = ev.RunCreated(seq=1, at=time.time(), run_id=run_id, tenant_id=envelope.tenant_id, kind=steps.KIND,
                            goal=freeze(envelope.payload.input), versions=STEPS_VERSIONS,
                            budget=Usage(model_calls=10, tool_calls=10, cost=1.0),
                            correlation_id=envelope.payload.idempotency_key)
    accepted = effects.accepted_message(envelope, run_id=run_id, partition=partition, workflow=steps.KIND,
                                        versions=STEPS_VERSIONS, labels={}, repeated=False, producer="tests")
    stored = await runs.create(conn, created, idempotency_key=envelope.payload.idempotency_key,
                               input_hash=admit.input_hash(envelope.payload), partition=partition,
                               announce=[accepted])
    assert stored is not None
    return stored


def _request(stored: StoredRun) -> tuple[str, str]:
    run_id = stored.snapshot.run_id
    return idempotency_key(run_id, "step:0", attempt_scope=1), request_hash(steps.ECHO.name, "1", args=ECHO)


def _finished(stored: StoredRun) -> tuple[runs.Planned, outbox.Message, dict[str, Any]]:
    """READY -> RUNNING, its one step recorded with its answer, COMPLETED (and its summary): the worker's
    last transition, its status broadcast and its ledger row."""
    at, (key, hashed) = time.time(), _request(stored)
    planned = plan(stored, [
        ev.RunStatusChanged(seq=stored.seq(1), at=at, to=RunStatus.RUNNING, reason="taken"),
        ev.ActionRecorded(seq=stored.seq(2), at=at, logical_action="step:0", tool=steps.ECHO.name, tool_version="1",
                          effect_kind=EffectKind.PURE, idempotency_key=key, request_hash=hashed,
                          receipt=freeze(ECHO)),
        ev.RunCompleted(seq=stored.seq(3), at=at, evidence=freeze({"steps": 1}))])
    broadcast = effects.broadcast_message(stored.snapshot, planned.after, producer="worker", cause="test")
    assert broadcast is not None
    return planned, broadcast, ledger.first_row(
        action_id=str(uuid.uuid4()), run_id=stored.snapshot.run_id, logical_action="step:0", tool=steps.ECHO.name,
        tool_version="1", effect_kind=EffectKind.PURE.value, idempotency_key=key, request_hash=hashed, request=ECHO,
        fencing_token=0, status=ActionStatus.CONFIRMED, receipt=ECHO)


async def _finish(conn: AsyncConnection, created: list[StoredRun]) -> None:
    """The runs' last transitions as the timer writes a batch (``run_batches.write_many``), with their broadcasts
    and ledger rows."""
    done = [_finished(stored) for stored in created]
    await run_batches.write_many(conn, [planned for planned, _, _ in done])
    await outbox.enqueue_many(conn, [message for _, message, _ in done])
    await conn.execute(insert(actions_table), [row for _, _, row in done])


async def _calling(conn: AsyncConnection, stored: StoredRun) -> StoredRun:
    """READY -> RUNNING with its step submitted (a write in flight): an open run with a ledger row and a timer."""
    at, (key, hashed) = time.time(), _request(stored)
    request = dict(logical_action="step:0", tool=steps.ECHO.name, tool_version="1", effect_kind=EffectKind.PURE,
                   idempotency_key=key, request_hash=hashed)
    planned = plan(stored, [
        ev.RunStatusChanged(seq=stored.seq(1), at=at, to=RunStatus.RUNNING, reason="taken"),
        ev.ActionPrepared(seq=stored.seq(2), at=at, **request),
        ev.ActionSubmitted(seq=stored.seq(3), at=at, logical_action="step:0")])
    after = await runs.write(conn, planned, call=LedgerRequest(
        action_id=str(uuid.uuid4()), run_id=stored.snapshot.run_id, logical_action="step:0", tool=steps.ECHO.name,
        tool_version="1", effect_kind=EffectKind.PURE.value, idempotency_key=key, request_hash=hashed, request=ECHO,
        fencing_token=0))
    await timers.schedule(conn, timer_key=f"{stored.snapshot.run_id}:heartbeat", run_id=stored.snapshot.run_id,
                          kind="heartbeat", delay=3600, payload={})
    return after


async def _unsettled(conn: AsyncConnection, stored: StoredRun) -> StoredRun:
    """Terminated while its write's outcome is unknown: finished, with an action the reconciler still settles."""
    at = time.time()
    calling = await _calling(conn, stored)
    after = await runs.append(conn, calling, [
        ev.ActionUnknown(seq=calling.seq(1), at=at, logical_action="step:0", cause="no answer"),
        ev.RunTerminated(seq=calling.seq(2), at=at, by="ops", reason="stop")])
    await ledger.record(conn, _request(stored)[0], ActionStatus.UNKNOWN)
    return after


async def _bystanders(conn: AsyncConnection, tag: str, n: int, run_ids: list[str]) -> None:
    """What else grows, ``n`` of each, written by each table's own writer: done rows, unmatched webhook
    events (which expire), and rows that no horizon removes (unreplayed quarantine entries, the ids
    of webhook deliveries)."""
    tx = PgTransaction(conn)
    for i in range(n):
        event = Translated(f"{tag}-hook-{i}", f"{tag}-corr-{i}", "ci", {"ok": True})
        await tx.keep("forge", event, {"n": i}, remember=True)
        await tx.matched("forge", event.event_id, run_ids[i])
        await tx.keep("forge", Translated(f"{tag}-unmatched-{i}", f"{tag}-nobody-{i}", "ci", {}), {"n": i},
                      remember=True)
        await quarantine.record_failure(conn, service="worker", message_id=f"{tag}-failing-{i}", error="boom")
        for replayed in (True, False):
            entry = await quarantine.put(conn, owner="worker", queue="longrun.worker.p0", body=b"{}", headers={},
                                         message_id=f"{tag}-q-{i}-{replayed}", error_code="handler_error",
                                         reason="boom", attempts=5)
            if replayed:
                await quarantine.mark_replayed(conn, entry, by="ops")
        await membership.heartbeat(conn, "worker", f"{tag}-gone-{i}", 0.001)
        await audit(conn, actor="ops", action="test.note", target=f"{tag}-{i}", reason="kept for a while")
        await timers.schedule(conn, timer_key=f"{run_ids[i]}:sleep", run_id=run_ids[i], kind="sleep", delay=0,
                              payload={})
    await timers.mark_fired(conn, [f"{r}:sleep" for r in run_ids[:n]])


async def _load(engine: AsyncEngine, tag: str, count: int, lane: int, *, finish: bool) -> list[tuple[str, str]]:
    """``count`` runs of one tenant (a lane), created and finished (or left calling) through the store's
    writers, with the inbox rows of their create and their wakeup; (run id, key) each."""
    made: list[tuple[str, str]] = []
    for start in range(0, count, CHUNK):
        async with engine.begin() as conn:
            envelopes = [_create_envelope(f"{tag}-t{lane}", f"{tag}-{lane}-{i}", i)
                         for i in range(start, min(start + CHUNK, count))]
            chunk = [await _created(conn, envelope) for envelope in envelopes]
            if finish:
                await run_batches.load_many(conn, [s.snapshot.run_id for s in chunk], lock=True)
                await _finish(conn, chunk)
            else:
                chunk = [await _calling(conn, stored) for stored in chunk]
            await inbox.claim_many(conn, "scheduler", [
                inbox.Message(e.event_id, "run.create", None) for e in envelopes])
            await inbox.claim_many(conn, "worker", [
                inbox.Message(f"wakeup-{s.snapshot.run_id}", "run.wakeup", s.snapshot.run_id) for s in chunk])
            if finish:
                await timers.schedule(conn, timer_key=f"{chunk[0].snapshot.run_id}:deadline",
                                      run_id=chunk[0].snapshot.run_id, kind="business_deadline", delay=86400,
                                      payload={})
        made += [(s.snapshot.run_id, e.payload.idempotency_key) for s, e in zip(chunk, envelopes, strict=True)]
    return made


async def _publish(engine: AsyncEngine, run_ids: list[str]) -> None:
    """What the relay does once it published the rows of these runs."""
    async with engine.begin() as conn:
        ids = list((await conn.execute(text("SELECT id FROM outbox WHERE published_at IS NULL "
                                            "AND aggregate_id = ANY(:r)"), {"r": run_ids})).scalars())
        await outbox.mark_published(conn, ids)


async def _counts(engine: AsyncEngine) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = (await conn.execute(text("""
            SELECT (SELECT count(*) FROM runs) AS runs,
                   (SELECT count(*) FROM runs WHERE archived_at IS NOT NULL) AS archived,
                   (SELECT count(DISTINCT run_id) FROM run_events) AS runs_with_events,
                   (SELECT count(DISTINCT run_id) FROM actions) AS runs_with_actions,
                   (SELECT count(*) FROM outbox WHERE published_at IS NOT NULL) AS published,
                   (SELECT count(*) FROM outbox WHERE published_at IS NULL) AS unpublished,
                   (SELECT count(*) FROM inbox_scheduler) AS inbox_scheduler,
                   (SELECT count(*) FROM inbox_worker) AS inbox_worker,
                   (SELECT count(*) FROM timers WHERE fired_at IS NOT NULL) AS fired,
                   (SELECT count(*) FROM timers WHERE fired_at IS NULL AND cancelled_at IS NULL) AS unfired,
                   (SELECT count(*) FROM timers WHERE cancelled_at IS NOT NULL) AS cancelled,
                   (SELECT count(*) FROM webhook_events WHERE matched_at IS NOT NULL) AS matched,
                   (SELECT count(*) FROM webhook_events WHERE matched_at IS NULL) AS unmatched,
                   (SELECT count(*) FROM webhook_deliveries) AS deliveries,
                   (SELECT count(*) FROM delivery_failures) AS failures,
                   (SELECT count(*) FROM quarantine WHERE replayed_at IS NOT NULL) AS replayed,
                   (SELECT count(*) FROM quarantine WHERE replayed_at IS NULL) AS unreplayed,
                   (SELECT count(*) FROM service_members) AS members,
                   (SELECT count(*) FROM audit_log WHERE action = 'test.note') AS audit""")))
        return dict(row.one()._mapping)


async def _open_state(engine: AsyncEngine, run_ids: list[str]) -> list[Any]:
    async with engine.connect() as conn:
        return [tuple(r) for r in (await conn.execute(text(
            "SELECT r.run_id, r.revision, r.updated_at, r.snapshot, r.archived_at, "
            "(SELECT count(*) FROM run_events e WHERE e.run_id = r.run_id), "
            "(SELECT array_agg(a.status) FROM actions a WHERE a.run_id = r.run_id), "
            "(SELECT array_agg(t.timer_key) FROM timers t WHERE t.run_id = r.run_id AND t.cancelled_at IS NULL) "
            "FROM runs r WHERE r.run_id = ANY(:ids) ORDER BY r.run_id"), {"ids": run_ids})).all()]


# About 30 s on a quiet machine; the bound leaves room for a loaded one.
@pytest.mark.long
@pytest.mark.timeout(240)
async def test_after_ten_thousand_finished_runs_every_table_keeps_only_what_its_horizon_keeps(
        clean, engine, tmp_path) -> None:
    started = time.monotonic()
    # Given 10,000 finished runs, written through the store's writers with what rides along (their
    # announcements and broadcasts, ledger rows, inbox rows), their outbox published, some timers
    # fired and some left for a far deadline; webhook events, delivery failures, quarantine entries,
    # dead members and audit rows; and 50 open runs calling a tool, and one terminated with its
    # action's outcome unknown
    lanes = await asyncio.gather(*(_load(engine, "old", FINISHED // LANES, lane, finish=True) for lane in range(LANES)))
    finished = [made for lane in lanes for made in lane]
    await _publish(engine, [run_id for run_id, _ in finished])
    open_runs = [run_id for run_id, _ in await _load(engine, "open", OPEN, 0, finish=False)]
    async with engine.begin() as conn:
        unsettled = (await _unsettled(conn, await _created(conn, _create_envelope("old-t9", "unsettled", 0))))
        await _bystanders(conn, "old", 40, [run_id for run_id, _ in finished])
    loaded = time.monotonic()
    # and, once all that is older than the horizons, a few of each that are not
    await asyncio.sleep(Settings.from_env(SHORT).retain_finished_runs + 0.5)
    young = [run_id for run_id, _ in await _load(engine, "young", 5, 0, finish=True)]
    await _publish(engine, young)
    async with engine.begin() as conn:
        await _bystanders(conn, "young", 5, young)
        await membership.heartbeat(conn, "worker", "alive", 3600)
    open_before = await _open_state(engine, [*open_runs, unsettled.snapshot.run_id])
    before = await _counts(engine)

    # and an artifact stored long ago that no row references (its transaction never committed)
    store = FilesystemArtifactStore(tmp_path / "artifacts")
    orphan = await _orphan(engine, store)

    # and the reconciler's rounds have dropped the finished runs' cleanups (their kind declares no step;
    # the terminated run owes none)
    assert (await clean_up(PgCleanupStore(engine), registry(), limit=0, clock=time.time))["nothing"] == FINISHED + 5

    # When a retention pass runs with those horizons
    settings = Settings.from_env(SHORT)
    pass_started = time.monotonic()
    pruned = await retention.run_pass(engine, store, horizons(settings), batch=500, archive_batch=500,
                                      orphan_grace=settings.artifact_orphan_grace)
    passed = time.monotonic()

    # Then every finished run past the horizon is archived, events and actions pruned; the young ones,
    # the open ones and the one with an action in doubt keep theirs
    after = await _counts(engine)
    assert pruned.runs_archived == FINISHED and pruned.events == 5 * FINISHED and pruned.actions == FINISHED
    assert after["runs"] == before["runs"] == FINISHED + OPEN + 1 + 5
    assert after["archived"] == FINISHED
    assert after["runs_with_events"] == after["runs_with_actions"] == OPEN + 1 + 5
    # and each other table holds only what its horizon keeps (and what no horizon removes)
    assert (after["published"], after["unpublished"]) == (2 * 5, before["unpublished"]) == (10, OPEN + 1)
    assert (after["inbox_scheduler"], after["inbox_worker"]) == (5, 5)
    # (the terminated run's timer was cancelled when it ended: pruned by the timers' horizon too)
    assert (after["fired"], after["unfired"], after["cancelled"]) == (5, OPEN + 1, 0)
    assert (after["matched"], after["unmatched"], after["deliveries"]) == (5, 5, 2 * (40 + 5))
    assert (after["failures"], after["replayed"], after["unreplayed"]) == (5, 5, 40 + 5)
    assert (after["members"], after["audit"]) == (5 + 1, 5)
    assert (before["fired"], before["unfired"], before["cancelled"]) == (45, FINISHED // CHUNK + OPEN + 1, 1)
    # and an open run is untouched, its events still append-only
    assert await _open_state(engine, [*open_runs, unsettled.snapshot.run_id]) == open_before
    with pytest.raises(ProgrammingError, match="append-only: DELETE refused"):
        async with engine.begin() as conn:
            await conn.execute(text("DELETE FROM run_events WHERE run_id = :r"), {"r": open_runs[0]})

    # Then the archives are in the artifact store, registered, and hold what was pruned: each run's
    # events fold into the snapshot its tombstone kept, and its action's ledger row
    archived: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for archive in pruned.archives:
        for line in (await store.get(RUNTIME, archive)).decode().splitlines():
            record = json.loads(line)
            archived[record["run_id"]].append(record)
    assert set(archived) == {run_id for run_id, _ in finished}
    async with engine.connect() as conn:
        registered = set((await conn.execute(text(
            "SELECT content_hash FROM artifacts WHERE media_type = 'application/x-ndjson'"))).scalars())
        tombstones = {r.run_id: (r.archive, r.snapshot, r.idempotency_key, r.input_hash) for r in (await conn.execute(
            text("SELECT run_id, archive, snapshot, idempotency_key, input_hash FROM runs "
                 "WHERE archived_at IS NOT NULL"))).all()}
    assert registered == set(pruned.archives)
    assert pruned.orphans == 1 and not await _stored(store, orphan)
    for run_id, records in list(archived.items())[::97]:
        kinds = [r["record"] for r in records]
        assert kinds == ["run", *["event"] * 5, "action"]  # created, running, recorded, completed, summary
        events = [ev.event_from_dict(r["data"]) for r in records if r["record"] == "event"]
        assert fold(events).to_dict() == tombstones[run_id][1]
        assert records[-1]["status"] == "CONFIRMED" and records[-1]["idempotency_key"] == _request_key(run_id)
        assert (records[0]["idempotency_key"], records[0]["input_hash"]) == tombstones[run_id][2:]
        assert records[0]["status"] == "COMPLETED"

    # When a pruned run's create is repeated, through admission as the scheduler handles it
    run_id, key = finished[1234]
    lane = 1234 // (FINISHED // LANES)
    assert lane == 0
    async with engine.begin() as conn:
        outcome = (await admit.create_run(PgTransaction(conn), _create_envelope(f"old-t{lane}", key, 1234 % (
            FINISHED // LANES)), kinds=registry(), partitions=PARTITIONS, slots=10, max_input_bytes=262144)).outcome
    # Then it returns that run, which stays archived
    assert outcome == {"run_id": run_id, "created": False}
    assert (await _counts(engine))["runs"] == after["runs"]
    # and the same key with another input is still refused as reused
    async with engine.begin() as conn:
        reused = (await admit.create_run(PgTransaction(conn), _create_envelope("old-t0", key, -1), kinds=registry(),
                                        partitions=PARTITIONS, slots=10, max_input_bytes=262144)).outcome
    assert (reused["code"], reused["existing_run_id"]) == ("idempotency_key_reused", run_id)

    # And a replayed wakeup older than the replay window would not be sent to a pruned run, and would
    # be to an open one
    async with engine.connect() as conn:
        assert await quarantine_ops.already_applied(conn, _wakeup(run_id)) == (
            f"run {run_id} already finished (COMPLETED)")
        assert await quarantine_ops.already_applied(conn, _wakeup(open_runs[0])) is None

    # and the pass recorded what it pruned
    async with engine.connect() as conn:
        recorded = (await conn.execute(text(
            "SELECT details FROM audit_log WHERE action = 'retention.pass'"))).scalars().all()
    assert [(r["runs_archived"], r["deleted"]["inbox_worker"]) for r in recorded] == [(FINISHED, FINISHED + OPEN)]
    print(f"\n{FINISHED} finished runs: loaded in {loaded - started:.1f}s, pruned in {passed - pass_started:.1f}s: "
          f"{pruned.summary()['deleted']}")


async def _orphan(engine: AsyncEngine, store: FilesystemArtifactStore) -> str:
    """An object of acme's whose upload began an hour ago and whose registering transaction never committed."""
    orphan = await RecordedUploads(engine, store).put("acme", f"orphan {uuid.uuid4()}".encode())
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE artifact_uploads SET started_at = now() - interval '1 hour' "
                                "WHERE content_hash = :h"), {"h": orphan})
    return orphan


async def _stored(store: FilesystemArtifactStore, content_hash: str) -> bool:
    try:
        await store.get("acme", content_hash)
    except FileNotFoundError:
        return False
    return True


def _request_key(run_id: str) -> str:
    return idempotency_key(run_id, "step:0", attempt_scope=1)


def _wakeup(run_id: str) -> Envelope:
    return effects.wake_message_of(tenant_id="acme", run_id=run_id, revision=1,
                                   partition=topology.partition_of(run_id, PARTITIONS), reason="admitted",
                                   producer="scheduler", cause="test").envelope


async def _quarantined(engine: AsyncEngine, envelope: Envelope, queue: str) -> int:
    async with engine.begin() as conn:
        return await quarantine.put(conn, owner=queue.split(".")[1], queue=queue,
                                    body=envelope.model_dump_json().encode(), headers={},
                                    message_id=envelope.event_id, error_code="handler_error",
                                    reason="a bug since fixed", attempts=5)


@pytest.mark.long
async def test_a_replay_older_than_the_inbox_horizon_repeats_no_effect(clean, engine, bus, services,
                                                                        tmp_path: Path) -> None:
    # Given the ensemble with short horizons (the reconciler prunes every second), an orphaned
    # artifact in its store, and a run it created, ran and finished
    store = FilesystemArtifactStore(services.logs / "artifacts")
    orphan = await _orphan(engine, store)
    ensemble = Ensemble(services, tmp_path)
    env = {**SHORT, "LONGRUN_RETENTION_INTERVAL": "1"}
    ensemble.start_services("gateway", "scheduler", "worker", "relay", "reconciler", **env)
    create = _create_envelope("acme", "replayed", 2)
    await bus.publish(topology.INGRESS_EXCHANGE, "run.create", to_message(create, user_id=broker_user(bus.url)))
    run_id = await eventually(lambda: run_id_for(engine, "acme", "replayed"), what="the run")
    await eventually(lambda: _is(engine, run_id, "COMPLETED"), timeout=60, what="completion")
    async with engine.connect() as conn:
        ledger_before = (await conn.execute(text("SELECT count(*) FROM actions WHERE run_id = :r"),
                                            {"r": run_id})).scalar()
    assert ledger_before == 1
    # and a copy of its create and of a wakeup, each quarantined after its consumer failed on it
    wakeup = _wakeup(run_id)
    entries = [await _quarantined(engine, create, topology.SCHEDULER_INGRESS_QUEUE),
               await _quarantined(engine, wakeup, topology.partition_queue(
                   "worker", topology.partition_of(run_id, PARTITIONS)))]
    # When the horizons pass: the run is archived and the inbox rows of what it handled are gone
    await eventually(lambda: _archived(engine, run_id), timeout=30, what="the run archived")
    await eventually(lambda: _inbox_empty(engine), timeout=30, what="the inboxes pruned")
    assert not await _stored(store, orphan)  # swept on the reconciler's schedule
    # and an operator replays both
    headers = await bearer(engine, "ops-oncall", "operator")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, headers=headers) as gateway:
        await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
        answers = [(await gateway.post(f"/quarantine/{entry}/replay", json={"reason": "consumer fixed"})).json()
                   for entry in entries]
        shown = (await gateway.get(f"/runs/{run_id}")).json()
    # Then neither is sent again: each was checked against what outlives the inbox
    assert answers == [
        {"id": entries[0], "message_id": create.event_id,
         "not_sent": f"run.create of key 'replayed' already made run {run_id}"},
        {"id": entries[1], "message_id": wakeup.event_id,
         "not_sent": f"run {run_id} already finished (COMPLETED)"}]
    # and the run is still the one run of its key, finished, with no new event or ledger row
    await asyncio.sleep(2)
    async with engine.connect() as conn:
        after = (await conn.execute(text(
            "SELECT (SELECT count(*) FROM runs WHERE idempotency_key = 'replayed'), "
            "(SELECT count(*) FROM run_events WHERE run_id = :r), (SELECT count(*) FROM actions WHERE run_id = :r), "
            "(SELECT count(*) FROM inbox_scheduler), (SELECT count(*) FROM inbox_worker)"), {"r": run_id})).one()
    assert tuple(after) == (1, 0, 0, 0, 0)
    assert await status_of(engine, run_id) == "COMPLETED"
    # and the operator API shows the run as archived, with where its archive is
    assert shown["snapshot"]["status"] == "COMPLETED" and shown["events"] == []
    assert shown["archived"]["location"].startswith("file://") and shown["archived"]["archive"] in shown[
        "archived"]["location"]
    archive = await store.get(RUNTIME, shown["archived"]["archive"])
    lines = [json.loads(line) for line in archive.decode().splitlines()]
    mine = [r for r in lines if r["run_id"] == run_id]
    assert [r["record"] for r in mine].count("action") == ledger_before


async def _is(engine: AsyncEngine, run_id: str, status: str) -> bool:
    return await status_of(engine, run_id) == status


async def _archived(engine: AsyncEngine, run_id: str) -> bool:
    async with engine.connect() as conn:
        return bool((await conn.execute(text("SELECT archived_at IS NOT NULL FROM runs WHERE run_id = :r"),
                                        {"r": run_id})).scalar())


async def _inbox_empty(engine: AsyncEngine) -> bool:
    async with engine.connect() as conn:
        return not (await conn.execute(text(
            "SELECT (SELECT count(*) FROM inbox_scheduler) + (SELECT count(*) FROM inbox_worker)"))).scalar()

