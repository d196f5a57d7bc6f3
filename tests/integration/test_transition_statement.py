"""A transition is one statement: all of it is written, or (a guard failed, a ledger key was taken) none of it."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import psycopg

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.app import effects
from longrun.services.worker.main import on_postgres
from longrun.app.worker.loop import Taken
from longrun.artifacts import INLINE_LIMIT, FilesystemArtifactStore
from longrun.authoring import Registry, RunKind, Tool, ToolResult
from longrun.bus import topology
from longrun.db import actions as ledger
from longrun.db import outbox, runs
from longrun.db.driver import Pool
from longrun.db.engine import psycopg_dsn
from longrun.domain import ActionStatus, EffectKind, freeze, idempotency_key, request_hash
from longrun.domain import events as ev
from longrun.envelope import decode
from longrun.errors import StaleRevision
from longrun.model import ScriptedModel
from longrun.ports.runs import LedgerRequest, plan
from longrun.workflows import STEPS_VERSIONS, steps
from longrun.services.scheduler import admitting
from tests.kinds import registry
from tests import ci_gate
from tests.fixtures import PARTITIONS
from tests.integration import runs_factory
from tests.integration.bus_helpers import wakeup

pytestmark = pytest.mark.integration


async def _steps_run(engine: AsyncEngine, n: int = 2) -> runs.StoredRun:
    return await runs_factory.created(engine, kind=steps.KIND, goal={"steps": n}, versions=STEPS_VERSIONS)


async def _seen(engine: AsyncEngine, run_id: str) -> tuple[int, list[str], list[tuple[str, int, str]]]:
    """The run's revision, its event types, and its ledger rows (logical action, attempts, status)."""
    async with engine.connect() as conn:
        revision = (await conn.execute(text("SELECT revision FROM runs WHERE run_id = :r"), {"r": run_id})).scalar()
        types = list((await conn.execute(text(
            "SELECT type FROM run_events WHERE run_id = :r ORDER BY seq"), {"r": run_id})).scalars())
        rows = [tuple(r) for r in await conn.execute(text(
            "SELECT logical_action, attempts, status FROM actions WHERE run_id = :r ORDER BY created_at"),
            {"r": run_id})]
    return revision, types, rows  # type: ignore[return-value]


def _ledger_row(run_id: str, *, hash_of: dict[str, int]) -> dict[str, object]:
    return {"action_id": str(uuid.uuid4()), "run_id": run_id, "logical_action": "step:0", "tool": steps.ECHO.name,
            "tool_version": steps.ECHO.version, "effect_kind": EffectKind.PURE.value,
            "idempotency_key": idempotency_key(run_id, "step:0", attempt_scope=1),
            "request_hash": request_hash(steps.ECHO.name, steps.ECHO.version, args=hash_of),
            "request": hash_of, "fencing_token": 1}


async def test_a_transition_whose_ledger_key_is_taken_writes_nothing(clean, engine) -> None:
    # Given a run, and a ledger row already holding the key its next action would use
    stored = await _steps_run(engine)
    run_id = stored.snapshot.run_id
    async with engine.begin() as conn:
        await ledger.prepare(conn, **_ledger_row(run_id, hash_of={"step": 0}))
    before = await _seen(engine, run_id)
    # When a transition carrying a first ledger row with that key is written
    planned = plan(stored, [ev.FactRecorded(seq=stored.seq(1), at=time.time(), key="k", value=freeze({}),
                                                 source="test")])
    call = LedgerRequest(**{**_ledger_row(run_id, hash_of={"step": 0}), "logical_action": "other"})
    with pytest.raises(Exception, match="duplicate key"):
        async with engine.connect() as conn:
            await runs.write(conn, planned, call=call)
    # Then neither the run, nor its events, nor the ledger changed
    assert await _seen(engine, run_id) == before


async def test_a_stale_transition_writes_none_of_its_rides(clean, engine) -> None:
    # Given a run that moved on since it was read
    stored = await _steps_run(engine)
    async with engine.begin() as conn:
        await runs.append(conn, stored, [ev.FactRecorded(seq=stored.seq(1), at=time.time(), key="a",
                                                         value=freeze({}), source="test")])
    before = await _seen(engine, stored.snapshot.run_id)
    # When a transition planned on the old state is written with a ledger row and a NOTIFY
    planned = plan(stored, [ev.FactRecorded(seq=stored.seq(1), at=time.time(), key="b", value=freeze({}),
                                                 source="test")])
    call = LedgerRequest(**_ledger_row(stored.snapshot.run_id, hash_of={"step": 0}))
    with pytest.raises(StaleRevision):
        async with engine.connect() as conn:
            await runs.write(conn, planned, rides=runs.Rides(notices=(("longrun_test", "x"),)), call=call)
    # Then nothing of it was written
    assert await _seen(engine, stored.snapshot.run_id) == before


async def _writes(engine: AsyncEngine, run_id: str) -> list[list[str]]:
    """The run's event types grouped by the transaction that wrote them, in order."""
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT xmin::text AS tx, type FROM run_events WHERE run_id = :r ORDER BY seq"),
                                   {"r": run_id})).all()
    groups: list[list[str]] = []
    for i, row in enumerate(rows):
        if i == 0 or row.tx != rows[i - 1].tx:
            groups.append([])
        groups[-1].append(row.type)
    return groups


async def _status_broadcasts(engine: AsyncEngine, run_id: str) -> list[tuple[str, str]]:
    """(from, to) of each status broadcast of the run, in outbox order."""
    async with engine.connect() as conn:
        bodies = (await conn.execute(text("SELECT payload FROM outbox WHERE aggregate_id = :r AND type = 'run.event' "
                                          "ORDER BY id"), {"r": run_id})).scalars().all()
    return [(b["payload"]["data"]["from"], b["payload"]["status"]) for b in bodies]


async def test_a_woken_runs_move_to_running_commits_with_its_first_step_and_its_last_step_with_its_completion(
        clean, engine, tmp_path) -> None:
    # Given a created run of three steps
    run_id = (await _steps_run(engine, 3)).snapshot.run_id
    # When a worker takes its wakeup and advances it
    await _advance(engine, tmp_path, run_id)
    # Then the move to RUNNING committed in the statement of the first step, each step before the next
    # call in one of its own, and the last with the completion; a pure call and its answer are one
    # event (prepared, submitted, charged, confirmed, with its receipt)
    step = ["action.recorded"]
    assert await _writes(engine, run_id) == [["run.created"], ["run.status_changed", *step], step,
                                             [*step, "run.completed", "run.summary"]]
    # and every step's ledger row with it: three calls, each confirmed once
    assert (await _seen(engine, run_id))[2] == [(f"step:{i}", 1, "CONFIRMED") for i in range(3)]
    # and both status changes were broadcast, each from the status before it
    assert await _status_broadcasts(engine, run_id) == [("READY", "RUNNING"), ("RUNNING", "COMPLETED")]


async def test_every_step_is_on_record_before_the_next_call_is_made(clean, engine, tmp_path) -> None:
    # Given a pure tool that looks, when called, at what the ledger holds for its run
    seen_at_call: list[list[str]] = []

    async def looking(args, idempotency_key, fencing_token):  # type: ignore[no-untyped-def]
        async with engine.connect() as conn:
            seen_at_call.append(list((await conn.execute(text(
                "SELECT logical_action FROM actions WHERE run_id = :r AND status = 'CONFIRMED' "
                "ORDER BY logical_action"), {"r": run_id})).scalars()))
        return ToolResult(idempotency_key, {"step": args["step"]})

    tool = Tool(steps.ECHO.name, steps.ECHO.version, EffectKind.PURE, steps.EchoArgs, looking)
    kinds = Registry([RunKind(steps.KIND, STEPS_VERSIONS, steps.Steps(), {tool.name: tool})])
    run_id = (await _steps_run(engine, n=3)).snapshot.run_id
    # When a worker advances the run
    await _advance(engine, tmp_path, run_id, kinds=kinds)
    # Then each call found every step before it confirmed on the ledger (a step's record is never
    # deferred past the next call, only to the decision after it)
    assert seen_at_call == [[], ["step:0"], ["step:0", "step:1"]]
    assert (await _seen(engine, run_id))[1][-2:] == ["run.completed", "run.summary"]


async def test_a_run_that_finishes_in_its_first_write_still_announces_that_it_ran(clean, engine, tmp_path) -> None:
    # Given a created run with nothing to do
    run_id = (await _steps_run(engine, 0)).snapshot.run_id
    # When a worker advances it: RUNNING and COMPLETED in one write
    await _advance(engine, tmp_path, run_id)
    assert await _writes(engine, run_id) == [["run.created"], ["run.status_changed", "run.completed", "run.summary"]]
    # Then downstream consumers still see it start, then complete
    assert await _status_broadcasts(engine, run_id) == [("READY", "RUNNING"), ("RUNNING", "COMPLETED")]


async def _advance(engine: AsyncEngine, tmp_path: object, run_id: str, *, kinds: Registry | None = None,
                   handover: effects.SlotHandover | None = None) -> None:
    """A worker in this process takes the run's wakeup and advances it until it leaves the worker."""
    statements = Pool(engine.url.render_as_string(hide_password=False), size=2)
    await statements.open()
    worker = on_postgres(engine=engine, statements=statements, kinds=kinds or registry(), model=ScriptedModel({}),
                      artifacts=FilesystemArtifactStore(tmp_path), instance_id="w1", lease_ttl=30,  # type: ignore[arg-type]
                      handover=handover)
    async with engine.begin() as conn:  # the wakeup is admission's: the run is admitted with it
        await conn.execute(text("UPDATE runs SET admitted_at = coalesce(admitted_at, now()) WHERE run_id = :r"),
                           {"r": run_id})
    try:
        taken = await worker.on_wakeup(wakeup(run_id, "go"))
        assert taken.outcome["taken"] and isinstance(taken.carried, Taken)
        await worker.advance(taken.carried)
    finally:
        await statements.close()


async def _advance_with_first_key_on_ledger(engine: AsyncEngine, tmp_path: object, *, hash_of: dict[str, int]) -> str:
    """A steps run whose first step's idempotency key is on the ledger for ``hash_of``'s request, advanced."""
    run_id = (await _steps_run(engine)).snapshot.run_id
    async with engine.begin() as conn:
        await ledger.prepare(conn, **_ledger_row(run_id, hash_of=hash_of))
    await _advance(engine, tmp_path, run_id)
    return run_id


async def test_a_first_call_whose_key_is_on_the_ledger_for_another_request_is_refused(clean, engine,
                                                                                     tmp_path) -> None:
    # Given a steps run whose first step's idempotency key is on the ledger for another request,
    # When a worker advances it
    run_id = await _advance_with_first_key_on_ledger(engine, tmp_path, hash_of={"step": 99})
    # Then the step is not recorded (the worker refuses the key, naming both hashes in its log) and
    # the ledger row is untouched
    revision, types, rows = await _seen(engine, run_id)
    assert "action.prepared" not in types and "action.recorded" not in types
    assert rows == [("step:0", 1, ActionStatus.SUBMITTED.value)]


async def test_a_first_call_whose_key_is_on_the_ledger_for_the_same_request_is_one_more_attempt(
        clean, engine, tmp_path) -> None:
    # Given a steps run whose first step's key is on the ledger for this very request (same hash),
    # When a worker advances it
    run_id = await _advance_with_first_key_on_ledger(engine, tmp_path, hash_of={"step": 0})
    # Then the run completes, and that step's ledger row counts the call as its second attempt
    _, types, rows = await _seen(engine, run_id)
    assert types[-2:] == ["run.completed", "run.summary"]
    assert rows[0] == ("step:0", 2, ActionStatus.CONFIRMED.value)
    assert [r[1] for r in rows[1:]] == [1]


async def _finish_with_handover(engine: AsyncEngine, tmp_path: object, run_id: str, *, slots: int = 1) -> None:
    await _advance(engine, tmp_path, run_id,
                   handover=effects.SlotHandover(slots=slots, aging_seconds=30, partitions=PARTITIONS))


async def test_a_finishing_run_hands_its_slot_to_the_next_queued_run_and_wakes_it(clean, engine, tmp_path) -> None:
    # Given a tenant with one slot, taken by an admitted run, and a run queued behind it
    first = await _steps_run(engine)
    async with engine.begin() as conn:
        assert await admitting.admit(conn, slots=1, aging_seconds=30) == [first.snapshot.run_id]
    queued = await _steps_run(engine)
    async with engine.connect() as conn:
        await conn.execute(text("DELETE FROM outbox"))
        await conn.commit()
    # When a worker finishes the admitted run
    await _finish_with_handover(engine, tmp_path, first.snapshot.run_id)
    # Then the queued run is admitted by that same write, and woken by a valid wakeup on its partition
    async with engine.connect() as conn:
        admitted = dict((await conn.execute(text("SELECT run_id, admitted_at IS NOT NULL FROM runs"))).all())
        woken = (await conn.execute(text(
            "SELECT payload, exchange, routing_key, partition FROM outbox WHERE type = 'run.wakeup'"))).all()
        finished_at = (await conn.execute(text(
            "SELECT recorded_at FROM run_events WHERE run_id = :r AND type = 'run.completed'"),
            {"r": first.snapshot.run_id})).scalar_one()
        admitted_at = (await conn.execute(text("SELECT admitted_at FROM runs WHERE run_id = :r"),
                                          {"r": queued.snapshot.run_id})).scalar_one()
    assert admitted == {first.snapshot.run_id: True, queued.snapshot.run_id: True}
    assert admitted_at == finished_at  # one transaction: its now() is both
    assert len(woken) == 1
    envelope = decode(json.dumps(outbox.envelope_of("run.wakeup", woken[0].payload)).encode())
    assert (envelope.type, envelope.run_id, envelope.tenant_id, envelope.expected_state_version) == (
        "run.wakeup", queued.snapshot.run_id, "acme", queued.snapshot.revision)
    assert (envelope.payload.reason, envelope.causation_id) == ("admitted", f"slot:{first.snapshot.run_id}")
    assert (woken[0].exchange, woken[0].routing_key, woken[0].partition) == (
        topology.work_exchange("worker"), topology.partition_key(queued.partition), queued.partition)


async def test_a_finishing_run_with_nobody_queued_notifies_admission_and_admits_nothing(clean, engine,
                                                                                      tmp_path) -> None:
    # Given a tenant's only run, admitted, and a listener on admission's channel
    only = await _steps_run(engine)
    async with engine.begin() as conn:
        await admitting.admit(conn, slots=1, aging_seconds=30)
    listener = await psycopg.AsyncConnection.connect(psycopg_dsn(str(engine.url.render_as_string(False))),
                                                     autocommit=True)
    try:
        await listener.execute(f"LISTEN {effects.ADMISSION_CHANNEL}")
        # When a worker finishes it
        await _finish_with_handover(engine, tmp_path, only.snapshot.run_id)
        # Then admission hears that a slot is free, and no wakeup was written
        notice = await asyncio.wait_for(anext(listener.notifies()), timeout=5)
    finally:
        await listener.close()
    assert notice.payload == "acme"
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM outbox WHERE type = 'run.wakeup'"))).scalar() == 1


async def test_a_tenant_above_its_slots_hands_nothing_on_so_it_shrinks_to_them(clean, engine, tmp_path) -> None:
    # Given a tenant with two admitted runs and one queued, whose slots were lowered to one
    running = [await _steps_run(engine) for _ in range(2)]
    async with engine.begin() as conn:
        await admitting.admit(conn, slots=2, aging_seconds=30)
    queued = await _steps_run(engine)
    # When a worker that knows the new limit finishes one of the admitted runs
    await _finish_with_handover(engine, tmp_path, running[0].snapshot.run_id, slots=1)
    # Then the queued run is not admitted: the tenant is down to its one slot
    async with engine.connect() as conn:
        admitted = (await conn.execute(text("SELECT admitted_at IS NOT NULL FROM runs WHERE run_id = :r"),
                                       {"r": queued.snapshot.run_id})).scalar_one()
    assert admitted is False


async def test_a_first_call_with_a_receipt_too_large_to_inline_is_on_the_ledger_with_its_artifact(
        clean, engine, tmp_path) -> None:
    # Given a pure tool whose receipt is over the inline limit (it goes to the artifact store)
    async def big(args, idempotency_key, fencing_token):  # type: ignore[no-untyped-def]
        return ToolResult(idempotency_key, {"step": args["step"], "log": "x" * (INLINE_LIMIT + 1)})

    tool = Tool(steps.ECHO.name, steps.ECHO.version, EffectKind.PURE, steps.EchoArgs, big)
    kinds = Registry([RunKind(steps.KIND, STEPS_VERSIONS, steps.Steps(), {tool.name: tool})])
    run_id = (await _steps_run(engine, n=1)).snapshot.run_id
    # When a worker advances the run
    await _advance(engine, tmp_path, run_id, kinds=kinds)
    # Then the run completed, and its call is on the ledger, confirmed, pointing at the registered artifact
    _, types, rows = await _seen(engine, run_id)
    assert types[-2:] == ["run.completed", "run.summary"]
    assert rows == [("step:0", 1, ActionStatus.CONFIRMED.value)]
    async with engine.connect() as conn:
        ref = (await conn.execute(text("SELECT receipt_ref FROM actions WHERE run_id = :r"), {"r": run_id})).scalar()
        registered = (await conn.execute(text("SELECT count(*) FROM artifacts WHERE content_hash = :h"),
                                         {"h": ref})).scalar()
    assert ref is not None and registered == 1


async def test_a_patch_taken_is_written_in_the_statement_of_the_decision_it_changed(clean, engine, tmp_path) -> None:
    # Given a ci_gate run (tests.ci_gate), whose fix retries a failed CI run under a patch
    run_id = (await runs_factory.created(engine, kind=ci_gate.KIND, goal=ci_gate.GOAL,
                                         versions=ci_gate.VERSIONS)).snapshot.run_id
    # When a worker advances it: CI fails twice, then passes
    await _advance(engine, tmp_path, run_id, kinds=Registry([ci_gate.kind()]))
    # Then the patch is written once, with the first retry and ahead of its events; the second retry,
    # which took the patch too, writes none
    ci = ["action.prepared", "action.submitted", "budget.charged"]
    answer = ["action.confirmed", "fact.recorded"]
    assert await _writes(engine, run_id) == [["run.created"], ["run.status_changed", *ci], answer,
                                             ["run.patch_taken", *ci], answer, ci, answer, ["run.completed", "run.summary"]]
