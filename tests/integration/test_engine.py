"""The run engine over the real ensemble: idempotent creation, fair admission, one writer per run."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from longrun.app.gateway import operate
from longrun.services.worker.main import on_postgres
from longrun.app.worker.loop import Taken, Worker
from longrun.artifacts import FilesystemArtifactStore
from longrun.db import leases, runs
from longrun.db.transaction import PgTransaction
from longrun.domain import events as ev
from longrun.errors import LeaseLost
from longrun.model import ScriptedModel
from longrun_dependency_upgrade import workflow as dependency_upgrade
from tests.kinds import registry
from tests.fixtures import eventually
from tests.integration.bus_helpers import wakeup
from tests.integration.ensemble import Ensemble, goal, new_key, publish_create, run_id_for

pytestmark = pytest.mark.integration


@pytest.fixture
def ensemble(services, tmp_path) -> Ensemble:  # type: ignore[no-untyped-def]
    return Ensemble(services, tmp_path)


async def _admitted(engine, tenant: str) -> int:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text(
            "SELECT count(*) FROM runs WHERE tenant_id = :t AND admitted_at IS NOT NULL AND status NOT IN "
            "('COMPLETED','FAILED','CANCELLED','TERMINATED','TIMED_OUT','BUDGET_EXHAUSTED')"), {"t": tenant})).scalar()


async def test_run_create_three_times_with_one_key_makes_one_run(clean, engine, bus, ensemble) -> None:
    # Given the scheduler and relay
    ensemble.start("scheduler", "longrun.services.scheduler")
    ensemble.start("relay", "longrun.services.outbox_relay")
    key = new_key()
    # When a producer publishes the same run.create three times
    for _ in range(3):
        await publish_create(bus, tenant="acme", key=key, input_=goal("dup"))
    # Then there is exactly one run, and every delivery was answered with it
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
    await eventually(lambda: _inbox_count(engine, 3), what="three deliveries handled")
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM runs"))).scalar() == 1
        outcomes = (await conn.execute(text("SELECT outcome FROM inbox_scheduler"))).scalars().all()
    assert [o["run_id"] for o in outcomes] == [run_id] * 3


async def test_same_key_with_a_different_input_is_refused_naming_both_hashes(clean, engine, bus, ensemble) -> None:
    ensemble.start("scheduler", "longrun.services.scheduler")
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_=goal("first"))
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
    await publish_create(bus, tenant="acme", key=key, input_=goal("second"))
    rejection = await eventually(lambda: _rejection(engine), what="a run.rejected event")
    payload = rejection["payload"]
    assert payload["existing_run_id"] == run_id
    assert payload["recorded_input_hash"] != payload["offered_input_hash"]
    assert len(payload["recorded_input_hash"]) == len(payload["offered_input_hash"]) == 64
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM runs"))).scalar() == 1


async def test_tenant_slots_cap_active_runs_and_other_tenants_are_not_held_back(clean, engine, bus, ensemble) -> None:
    # Given a scheduler with 2 slots per tenant and no worker (admitted runs stay active)
    ensemble.start("scheduler", "longrun.services.scheduler", LONGRUN_TENANT_SLOTS="2")
    for i in range(100):
        await publish_create(bus, tenant="tenant-a", key=f"a-{i}", input_=goal(f"a{i}"))
    await eventually(lambda: _count(engine, "tenant-a", 100), timeout=60, what="100 runs of tenant A")
    # When tenant B asks for one run
    await publish_create(bus, tenant="tenant-b", key="b-0", input_=goal("b0"))
    # Then B is admitted at once, and A never has more than 2 active runs
    b_run = await eventually(lambda: run_id_for(engine, "tenant-b", "b-0"), what="B's run")
    await eventually(lambda: _is_admitted(engine, b_run), timeout=5, what="B admitted")
    for _ in range(20):
        assert await _admitted(engine, "tenant-a") <= 2
        await asyncio.sleep(0.05)
    assert await _admitted(engine, "tenant-a") == 2
    # and a finished run frees its slot for the next one
    async with engine.connect() as conn:
        first = (await conn.execute(text("SELECT run_id FROM runs WHERE tenant_id = 'tenant-a' "
                                         "AND admitted_at IS NOT NULL LIMIT 1"))).scalar()
    async with engine.begin() as conn:
        await operate.terminate(PgTransaction(conn), first, actor="tests", reason="free a slot")
    await eventually(lambda: _admitted_total(engine, "tenant-a", 3), timeout=5, what="the next run admitted")
    assert await _admitted(engine, "tenant-a") == 2


async def test_a_run_with_a_free_slot_is_admitted_in_the_transaction_that_creates_it(
        clean, engine, bus, ensemble) -> None:
    # Given a scheduler with one slot per tenant and no worker
    ensemble.start("scheduler", "longrun.services.scheduler", LONGRUN_TENANT_SLOTS="1")
    # When a run is asked for while the slot is free, then another while it is taken
    await publish_create(bus, tenant="tenant-d", key="first", input_=goal("first"))
    first = await eventually(lambda: run_id_for(engine, "tenant-d", "first"), what="the first run")
    await publish_create(bus, tenant="tenant-d", key="second", input_=goal("second"))
    second = await eventually(lambda: run_id_for(engine, "tenant-d", "second"), what="the second run")
    # Then the first was admitted by its creating transaction (one now() for both), the second waits
    assert await _admission(engine, first) == "with its creation"
    assert await _admission(engine, second) == "waiting"
    # and once the slot frees, the admission round admits the second, later than it was created
    async with engine.begin() as conn:
        await operate.terminate(PgTransaction(conn), first, actor="tests", reason="free the slot")
    await eventually(lambda: _is_admitted(engine, second), timeout=5, what="the second run admitted")
    assert await _admission(engine, second) == "later"


async def _admission(engine, run_id: str) -> str:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text(
            "SELECT CASE WHEN admitted_at IS NULL THEN 'waiting' WHEN admitted_at = created_at "
            "THEN 'with its creation' ELSE 'later' END FROM runs WHERE run_id = :r"), {"r": run_id})).scalar_one()


async def test_aging_admits_an_old_low_priority_run_before_new_high_priority_ones(clean, engine, bus, ensemble) -> None:
    # Given one slot, an old priority-0 run and newer priority-9 runs (30 s of waiting = 1 point)
    await publish_create(bus, tenant="tenant-c", key="old-low", input_=goal("low"), priority=0)
    for i in range(3):
        await publish_create(bus, tenant="tenant-c", key=f"new-high-{i}", input_=goal(f"h{i}"), priority=9)
    scheduler = ensemble.start("scheduler", "longrun.services.scheduler", LONGRUN_TENANT_SLOTS="1",
                               LONGRUN_PRIORITY_AGING="30")
    await eventually(lambda: _count(engine, "tenant-c", 4), what="four runs")
    scheduler.terminate()
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE runs SET admitted_at = NULL"))
        await conn.execute(text("UPDATE runs SET created_at = now() - interval '10 minutes' "
                                "WHERE idempotency_key = 'old-low'"))
    # When the scheduler admits again
    ensemble.start("scheduler", "longrun.services.scheduler", LONGRUN_TENANT_SLOTS="1", LONGRUN_PRIORITY_AGING="30")
    # Then the old low-priority run goes first (0 + 600/30 = 20 > 9)
    low = await run_id_for(engine, "tenant-c", "old-low")
    await eventually(lambda: _is_admitted(engine, low), what="the aged run admitted")


async def test_two_workers_woken_for_one_run_at_once_exactly_one_commits(clean, engine, statements, bus,
                                                                         ensemble) -> None:
    # Given a created run
    ensemble.start("scheduler", "longrun.services.scheduler")
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_=goal("race"))
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
    kinds = registry()
    model = ScriptedModel(dependency_upgrade.model_script())
    store = FilesystemArtifactStore(ensemble.tmp / "artifacts")
    workers = [on_postgres(engine=engine, statements=statements, kinds=kinds, model=model, artifacts=store,
                        instance_id=f"w{i}", lease_ttl=30) for i in (1, 2)]

    # When each takes a wakeup of its own at the same moment
    handled = await asyncio.gather(*(w.on_wakeup(wakeup(run_id, f"same-moment-{i}")) for i, w in enumerate(workers)))
    outcomes = [h.outcome for h in handled]
    # Then exactly one holds the run
    assert sorted(o["taken"] for o in outcomes) == [False, True]
    assert not any(h.duplicate for h in handled)
    async with engine.connect() as conn:
        before = await runs.load(conn, run_id)
    assert before is not None
    # and the loser, writing with a fence it never held, changes nothing
    loser = workers[[o["taken"] for o in outcomes].index(False)]
    with pytest.raises(LeaseLost):
        async with engine.begin() as conn:
            await runs.append(conn, before, [_noop(before)], fence=runs.Fence(loser.instance_id, before.fencing_token))
    async with engine.connect() as conn:
        after = await runs.load(conn, run_id)
    assert after == before


async def test_one_wakeup_handled_twice_at_once_takes_the_run_once(clean, engine, statements, bus, ensemble) -> None:
    # Given a created run and two workers handed the same delivery (a redelivery during a partition handover)
    ensemble.start("scheduler", "longrun.services.scheduler")
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_=goal("twice"))
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
    async with engine.connect() as conn:
        before = await runs.load(conn, run_id)
    assert before is not None
    workers = [on_postgres(engine=engine, statements=statements, kinds=registry(), model=ScriptedModel({}),
                        artifacts=FilesystemArtifactStore(ensemble.tmp / "artifacts"), instance_id=f"w{i}",
                        lease_ttl=30) for i in (1, 2)]
    message = wakeup(run_id, "twice")
    # When both handle it at the same moment
    handled = await asyncio.gather(*(w.on_wakeup(message) for w in workers))
    # Then one took the run, and the other got that recorded outcome as a duplicate
    assert sorted(h.duplicate for h in handled) == [False, True]
    assert handled[0].outcome == handled[1].outcome and handled[0].outcome["taken"]
    # and the lease was taken once: one inbox row, the token one higher
    async with engine.connect() as conn:
        after = await runs.load(conn, run_id)
        rows = (await conn.execute(text("SELECT count(*) FROM inbox_worker WHERE message_id = :m"),
                                   {"m": message.event_id})).scalar()
    assert after is not None and after.fencing_token == before.fencing_token + 1 == handled[0].outcome["token"]
    assert rows == 1


async def test_a_stale_worker_is_fenced_out_after_its_lease_is_taken_over(clean, engine, bus, ensemble) -> None:
    ensemble.start("scheduler", "longrun.services.scheduler")
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_=goal("stale"))
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
    async with engine.begin() as conn:
        old = await leases.take_lease(conn, run_id, "old-worker", ttl=0.2)
    await asyncio.sleep(0.5)
    async with engine.begin() as conn:
        new = await leases.take_lease(conn, run_id, "new-worker", ttl=30)
    assert old is not None and new is not None and new.token == old.token + 1
    async with engine.connect() as conn:
        stored = await runs.load(conn, run_id)
    assert stored is not None
    with pytest.raises(LeaseLost):
        async with engine.begin() as conn:
            await runs.append(conn, stored, [_noop(stored)], fence=old)
    async with engine.connect() as conn:
        assert await runs.load(conn, run_id) == stored


def _noop(stored: runs.StoredRun) -> ev.RunEvent:
    """A write that is legal whether the run is still READY or already RUNNING: only the fence may refuse it."""
    return ev.FactRecorded(seq=stored.seq(), at=0.0, key="stale", value="a stale write", source="agent")


async def _inbox_count(engine, n: int) -> bool:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT count(*) FROM inbox_scheduler"))).scalar() >= n


async def _rejection(engine):  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT payload FROM outbox WHERE type = 'run.rejected'"))).scalar()


async def _count(engine, tenant: str, n: int) -> bool:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT count(*) FROM runs WHERE tenant_id = :t"), {"t": tenant})).scalar() >= n


async def _is_admitted(engine, run_id: str) -> bool:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT admitted_at IS NOT NULL FROM runs WHERE run_id = :r"),
                                   {"r": run_id})).scalar()


async def _admitted_total(engine, tenant: str, n: int) -> bool:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT count(*) FROM runs WHERE tenant_id = :t AND admitted_at IS NOT NULL"),
                                   {"t": tenant})).scalar() >= n


@pytest.mark.long
async def test_a_run_leased_while_every_slot_is_busy_keeps_its_lease_until_it_gets_one(
        clean, engine, statements, bus, ensemble) -> None:
    # Given a worker with one slot and a short lease, and a created run
    run_id = await _created(engine, bus, ensemble, "queued")
    worker = _one_slot_worker(engine, statements, ensemble, "w1", lease_ttl=1.5)
    taken = (await worker.on_wakeup(wakeup(run_id, "queued"))).outcome
    fence = runs.Fence(taken["owner"], taken["token"])
    async with engine.connect() as conn:
        at_wakeup = await runs.load(conn, run_id)
    assert at_wakeup is not None
    # When it is woken while its only slot is busy for twice the lease
    async with worker._slots:
        worker.start(Taken(run_id, fence, "test:queued"))
        await asyncio.sleep(3.0)
        # Then nobody else can take the run meanwhile: its lease is kept alive
        async with engine.begin() as conn:
            assert await leases.take_lease(conn, run_id, "w2", ttl=30) is None
    # and once the slot frees, the run is advanced under the same fence
    await eventually(lambda: _advanced_since(engine, run_id, at_wakeup.stored_seq), what="the run advanced by w1")
    async with engine.connect() as conn:
        stored = await runs.load(conn, run_id)
    assert stored is not None and stored.fencing_token == fence.token
    await worker.drain()


async def _advanced_since(engine, run_id: str, seq: int) -> bool:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        stored = await runs.load(conn, run_id)
    return stored is not None and stored.stored_seq > seq


async def test_a_stopping_worker_hands_on_a_run_waiting_for_a_slot_as_it_was(
        clean, engine, statements, bus, ensemble) -> None:
    # Given a worker with one slot, busy, and a run whose wakeup it took
    run_id = await _created(engine, bus, ensemble, "handed on")
    worker = _one_slot_worker(engine, statements, ensemble, "w1", lease_ttl=30)
    async with engine.connect() as conn:
        created = await runs.load(conn, run_id)
    assert created is not None
    # When it stops, with time to finish what it holds, while the run still waits for the slot
    await _stopped_with_the_run_waiting_for_a_slot(worker, run_id)
    # Then the run was handed on unadvanced: its lease free, waiting for a worker that runs it, which a
    # live worker adopts; and the stopping worker adopts nothing more
    stored, waiting_for = await _lease_and_marker(engine, run_id)
    assert stored.lease_owner is None
    assert stored.stored_seq == created.stored_seq
    assert waiting_for == f"{stored.snapshot.kind}@{stored.snapshot.versions.workflow}"
    assert await worker.adopt_waiting() == 0
    live = _one_slot_worker(engine, statements, ensemble, "w2", lease_ttl=30)
    assert await live.adopt_waiting() == 1
    await live.drain()


async def test_a_stopping_worker_only_releases_a_run_it_took_with_no_work_for_a_worker(
        clean, engine, statements, bus, ensemble) -> None:
    # Given a run paused by an operator, and a worker with one slot, busy, that took the run's lease
    # with a wakeup sent before the pause
    run_id = await _created(engine, bus, ensemble, "paused")
    async with engine.begin() as conn:
        await operate.pause(PgTransaction(conn), run_id, actor="tests", reason="hold it")
    worker = _one_slot_worker(engine, statements, ensemble, "w1", lease_ttl=30)
    # When it stops while the run waits for the slot
    await _stopped_with_the_run_waiting_for_a_slot(worker, run_id)
    # Then the lease is released and the run is not marked as waiting for a worker: it has no work for one
    stored, waiting_for = await _lease_and_marker(engine, run_id)
    assert stored.lease_owner is None and stored.snapshot.status.value == "PAUSED"
    assert waiting_for is None


async def _stopped_with_the_run_waiting_for_a_slot(worker: Worker, run_id: str) -> None:
    """``worker`` takes the run's lease with a wakeup and is stopped, with a grace, while its only slot
    is busy."""
    taken = (await worker.on_wakeup(wakeup(run_id, "before the stop"))).outcome
    assert taken["taken"], taken
    async with worker._slots:
        worker.start(Taken(run_id, runs.Fence(taken["owner"], taken["token"]), "test:stopping"))
        stopped = asyncio.create_task(worker.drain(grace=30))
        while not worker._stopping:  # the slot is freed only once the worker is stopping
            await asyncio.sleep(0)
    await asyncio.wait_for(stopped, timeout=10)


async def _lease_and_marker(engine, run_id: str) -> tuple[runs.StoredRun, str | None]:  # type: ignore[no-untyped-def]
    """The run as stored, and what worker it is marked as waiting for, if any."""
    async with engine.connect() as conn:
        stored = await runs.load(conn, run_id)
        waiting_for = (await conn.execute(text("SELECT awaiting_worker FROM runs WHERE run_id = :r"),
                                          {"r": run_id})).scalar()
    assert stored is not None
    return stored, waiting_for


async def _created(engine, bus, ensemble: Ensemble, name: str) -> str:  # type: ignore[no-untyped-def]
    """A run created through the scheduler: its id."""
    ensemble.start("scheduler", "longrun.services.scheduler")
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_=goal(name))
    return await eventually(lambda: run_id_for(engine, "acme", key), what="the run")


def _one_slot_worker(engine, statements, ensemble: Ensemble, instance_id: str, *,  # type: ignore[no-untyped-def]
                     lease_ttl: float) -> Worker:
    return on_postgres(engine=engine, statements=statements, kinds=registry(),
                       model=ScriptedModel(dependency_upgrade.model_script()),
                       artifacts=FilesystemArtifactStore(ensemble.tmp / "artifacts"), instance_id=instance_id,
                       lease_ttl=lease_ttl, concurrency=1)
