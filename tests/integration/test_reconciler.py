"""Reconciler: actions in doubt are settled by idempotency key, abandoned runs re-woken, silence and dead letters kept.

The scenarios of the issue run over the real ensemble (forge, gateway, scheduler, worker,
timer, reconciler, relay as processes): the forge times out after creating the merge
request, or the worker dies right before sending it. The use cases' decisions (every
verdict, re-claiming, replicas racing, leases, alerts, drift, dead letters) are driven
in-process against real PostgreSQL and RabbitMQ, with runs built through the domain
events and the store, and probe tools whose far side is a Python function.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ConfigDict
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.app.reconciler.common import CORRECTION_ALERT, DRIFT_ALERT, SILENT_ALERT
from longrun.app.reconciler.common import METRICS
from longrun.app.reconciler.settle import FOUND_NOTE
from longrun.artifacts import INLINE_LIMIT, FilesystemArtifactStore
from longrun.authoring import Registry, RunKind, Tool, ToolResult
from longrun.bus import topology
from longrun.bus.connection import Bus
from longrun.db import actions as ledger
from longrun.db import leases
from longrun.db import outbox, run_batches, runs
from longrun.services.reconciler.alerts import check_drift, flag_silent_runs
from longrun.services.reconciler.dead_letters import REWAKES_AFTER_DEAD_LETTER, ingest_quarantine_queue
from longrun.services.reconciler.sweeps import reconcile_unknown, rewake_expired_leases
from longrun.domain import (
    TERMINAL,
    ActionStatus,
    EffectKind,
    PinnedVersions,
    RunStatus,
    Usage,
    freeze,
    idempotency_key,
    request_hash,
)
from longrun.domain import events as ev
from longrun.errors import LeaseLost, ToolRejected, ToolUnavailable
from tests.fixtures import DELIVERY_LIMIT, PARTITIONS, eventually
from tests.integration.bus_helpers import publish, wakeup
from tests.integration.ensemble import ROOT, Ensemble, goal, new_key, publish_create, run_id_for
from tests.integration.identities import bearer

pytestmark = pytest.mark.integration

VERSIONS = PinnedVersions(workflow="1", prompt="1", model_policy="1", tool_schemas="1")
PR_TOOL = "probe.open_pr"
REQUEST = {"repo": "acme/payments", "title": "Upgrade payment-sdk"}
MR = "merge_request"


# -- in-process: a probe run kind whose far side is a function ---------------------------------------


class _PrArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    repo: str
    title: str


class _NoDecisions:
    kind = "probe"

    def decide(self, state: Any, ctx: Any) -> Any:
        raise AssertionError("the reconciler never asks the workflow to decide")

    def accept(self, state: Any, evidence: Any) -> tuple[str, ...]:
        return ()


async def _never_executed(args: Any, key: str, token: int) -> ToolResult:
    raise AssertionError("the reconciler never executes a tool")


Lookup = Callable[[str], Awaitable[ToolResult | None]]


def _kinds(lookup: Lookup | None, effect: EffectKind = EffectKind.NON_IDEMPOTENT_WRITE) -> Registry:
    tool = Tool(PR_TOOL, "1", effect, _PrArgs, _never_executed, lookup, start_to_close=2.0)
    return Registry([RunKind("probe", VERSIONS, _NoDecisions(), {PR_TOOL: tool})])  # type: ignore[arg-type]


def _answer(*answers: ToolResult | Exception | None) -> tuple[Lookup, list[str]]:
    """A far side that gives ``answers`` in turn, and the keys it was asked about."""
    asked: list[str] = []

    async def lookup(key: str) -> ToolResult | None:
        asked.append(key)
        answer = answers[min(len(asked), len(answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return lookup, asked


async def _created(engine: AsyncEngine, *, at: float | None = None) -> runs.StoredRun:
    run_id = f"run-{uuid.uuid4()}"
    event = ev.RunCreated(seq=1, at=at or time.time(), run_id=run_id, tenant_id="acme", kind="probe",
                          goal=freeze({"repo": REQUEST["repo"]}), versions=VERSIONS,
                          budget=Usage(model_calls=5, tool_calls=5, cost=1.0))
    async with engine.begin() as conn:
        stored = await runs.create(conn, event, idempotency_key=run_id, input_hash="h" * 64,
                                   partition=topology.partition_of(run_id, PARTITIONS))
    assert stored is not None
    return stored


async def _submitted(engine: AsyncEngine, effect: EffectKind, outcome: list[ev.RunEvent] | None = None,
                     ledger_status: ActionStatus = ActionStatus.UNKNOWN, **ledger_fields: Any) -> tuple[str, str]:
    """A run whose worker submitted ``pr`` and then recorded ``outcome`` (default: unknown, run parked)."""
    stored = await _created(engine)
    run_id, at = stored.snapshot.run_id, time.time()
    key = idempotency_key(run_id, "pr", attempt_scope=1)
    digest = request_hash(PR_TOOL, "1", args=REQUEST)
    seq = stored.seq
    outcome = outcome if outcome is not None else [
        ev.ActionUnknown(seq=seq(4), at=at, logical_action="pr", cause="no answer within 2.0s"),
        ev.RunStatusChanged(seq=seq(5), at=at, to=RunStatus.ACTION_UNKNOWN, reason="pr: outcome unknown")]
    async with engine.begin() as conn:
        await runs.append(conn, stored, [
            ev.RunStatusChanged(seq=seq(1), at=at, to=RunStatus.RUNNING, reason="taken by test"),
            ev.ActionPrepared(seq=seq(2), at=at, logical_action="pr", tool=PR_TOOL, tool_version="1",
                              effect_kind=effect, idempotency_key=key, request_hash=digest),
            ev.ActionSubmitted(seq=seq(3), at=at, logical_action="pr"),
            *outcome])
        await ledger.prepare(conn, action_id=str(uuid.uuid4()), run_id=run_id, logical_action="pr", tool=PR_TOOL,
                             tool_version="1", effect_kind=effect.value, idempotency_key=key, request_hash=digest,
                             request=dict(REQUEST), fencing_token=1)
        await ledger.record(conn, key, ledger_status, **ledger_fields)
    return run_id, key


async def _rows(engine: AsyncEngine, sql: str, **params: Any) -> list[Any]:
    async with engine.connect() as conn:
        return list(await conn.execute(text(sql), params))


async def _events(engine: AsyncEngine, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [(r.type, r.data) for r in await _rows(
        engine, "SELECT type, data FROM run_events WHERE run_id = :r ORDER BY seq", r=run_id)]


async def _wakeups(engine: AsyncEngine, run_id: str, reason: str | None = None) -> int:
    rows = await _rows(engine, "SELECT payload FROM outbox WHERE aggregate_id = :r AND type = 'run.wakeup'", r=run_id)
    reasons = [outbox.envelope_of("run.wakeup", r.payload)["payload"]["reason"] for r in rows]
    return sum(1 for r in reasons if reason is None or r == reason)


async def _state(engine: AsyncEngine, run_id: str, key: str) -> tuple[runs.StoredRun, ledger.LedgerRow]:
    async with engine.connect() as conn:
        stored, row = await runs.load(conn, run_id), await ledger.get(conn, key)
    assert stored is not None and row is not None
    return stored, row


FOUND = ToolResult("42", {"id": 42, **REQUEST, "url": "https://forge/acme/payments/42"})
VERDICTS = {
    # lookup, effect kind -> action outcome, run status
    "found by key": ([FOUND], EffectKind.NON_IDEMPOTENT_WRITE, ActionStatus.CONFIRMED, RunStatus.READY),
    "nothing under the key": ([None], EffectKind.NON_IDEMPOTENT_WRITE, ActionStatus.RETRYABLE, RunStatus.READY),
    "found, but for another request": ([ToolResult("43", {**REQUEST, "repo": "acme/other"})],
                                       EffectKind.NON_IDEMPOTENT_WRITE, ActionStatus.NEEDS_ATTENTION,
                                       RunStatus.NEEDS_ATTENTION),
    "lookup fails": ([ToolRejected(PR_TOOL, 400, "bad key")], EffectKind.NON_IDEMPOTENT_WRITE,
                     ActionStatus.NEEDS_ATTENTION, RunStatus.NEEDS_ATTENTION),
    "no lookup, not repeatable": (None, EffectKind.NON_IDEMPOTENT_WRITE, ActionStatus.NEEDS_ATTENTION,
                                  RunStatus.NEEDS_ATTENTION),
    "no lookup, idempotent write": (None, EffectKind.IDEMPOTENT_WRITE, ActionStatus.RETRYABLE, RunStatus.READY),
}


@pytest.mark.parametrize("case", list(VERDICTS))
async def test_each_answer_of_the_far_side_settles_the_action_and_the_run(clean, engine, case: str) -> None:
    answers, effect, outcome, run_status = VERDICTS[case]
    lookup, asked = _answer(*answers) if answers is not None else (None, [])
    kinds = _kinds(lookup, effect)
    # Given a run parked in ACTION_UNKNOWN by a timed-out submission
    run_id, key = await _submitted(engine, effect)
    # When the reconciler sweeps (twice: the second finds nothing left to do)
    first = await reconcile_unknown(engine, kinds, limit=10, clock=time.time)
    again = await reconcile_unknown(engine, kinds, limit=10, clock=time.time)
    # Then the action and the run moved exactly once, through RECONCILING, asking by the action's key
    assert first == {outcome.value: 1} and not again
    assert asked == ([key] if answers is not None else [])
    stored, row = await _state(engine, run_id, key)
    record = stored.snapshot.action("pr")
    assert record is not None and record.status is outcome and row.status == outcome.value
    assert stored.snapshot.status is run_status
    types = [t for t, _ in await _events(engine, run_id)]
    started = types.index("action.reconciliation_started")
    assert types[started - 2:started + 2] == ["action.unknown", "run.status_changed",
                                              "action.reconciliation_started", "action.reconciled"]
    # and a run that can move on is woken, one that needs a person is not
    assert await _wakeups(engine, run_id) == (1 if run_status is RunStatus.READY else 0)
    if outcome is ActionStatus.CONFIRMED:
        receipt = stored.snapshot.fact("receipt:pr")
        assert receipt is not None and receipt.source == f"tool:{PR_TOOL}"
        assert dict(receipt.value) == FOUND.receipt == row.receipt and row.external_id == "42"
        assert record.external_id == "42" and record.detail == FOUND_NOTE and types[-1] == "fact.recorded"
    if outcome is ActionStatus.NEEDS_ATTENTION:
        assert types[-1] == "run.status_changed"


async def test_a_large_receipt_found_by_key_is_kept_as_an_artifact_like_the_worker_keeps_it(
        clean, engine, tmp_path) -> None:
    # Given a far side whose object is larger than a receipt kept inline
    big = ToolResult("42", {**REQUEST, "diff": "x" * (INLINE_LIMIT + 1)})
    lookup, _ = _answer(big)
    store = FilesystemArtifactStore(tmp_path / "artifacts")
    run_id, key = await _submitted(engine, EffectKind.NON_IDEMPOTENT_WRITE)
    # When the reconciler confirms the action
    assert await reconcile_unknown(engine, _kinds(lookup), limit=10, clock=time.time, artifacts=store) == {
        "CONFIRMED": 1}
    # Then the run and the ledger reference the uploaded original, which holds the whole object
    stored, row = await _state(engine, run_id, key)
    receipt = stored.snapshot.fact("receipt:pr")
    assert receipt is not None and row.receipt is not None
    ref = dict(receipt.value)["artifact"]
    assert row.receipt["artifact"] == ref and stored.snapshot.action("pr").receipt_ref == ref  # type: ignore[union-attr]
    assert json.loads(await store.get("acme", ref)) == big.receipt
    assert await _rows(engine, "SELECT run_id, tenant_id FROM artifacts WHERE content_hash = :h",
                       h=ref) == [(run_id, "acme")]


async def test_far_side_unavailable_decides_nothing_and_an_abandoned_claim_is_taken_again(clean, engine) -> None:
    # Given a far side that cannot answer at first
    lookup, asked = _answer(ToolUnavailable(PR_TOOL, "connection refused"), FOUND)
    kinds = _kinds(lookup)
    run_id, key = await _submitted(engine, EffectKind.NON_IDEMPOTENT_WRITE)
    # When the reconciler asks: the action stays RECONCILING, with the reason in the ledger
    assert await reconcile_unknown(engine, kinds, limit=10, clock=time.time) == {"deferred": 1}
    stored, row = await _state(engine, run_id, key)
    assert row.status == "RECONCILING" and stored.snapshot.status is RunStatus.ACTION_UNKNOWN
    # and it is left alone while the claim is fresh
    assert not await reconcile_unknown(engine, kinds, limit=10, clock=time.time, abandoned_after=60)
    assert len(asked) == 1
    # Then, once abandoned, it is claimed again and the history says why the first attempt ended
    assert await reconcile_unknown(engine, kinds, limit=10, clock=time.time, abandoned_after=0) == {"CONFIRMED": 1}
    reconciling = [(t, d.get("outcome"), d.get("note", "")) for t, d in await _events(engine, run_id)
                   if t.startswith("action.reconcil")]
    assert [(t, o) for t, o, _ in reconciling] == [
        ("action.reconciliation_started", None), ("action.reconciled", "UNKNOWN"),
        ("action.reconciliation_started", None), ("action.reconciled", "CONFIRMED")]
    assert "lookup unavailable" in reconciling[1][2]
    assert (await _state(engine, run_id, key))[0].snapshot.status is RunStatus.READY


async def test_two_replicas_claim_an_action_once(clean, engine) -> None:
    # Given an action in doubt and a far side that answers slowly
    asked: list[str] = []

    async def slow(key: str) -> ToolResult:
        asked.append(key)
        await asyncio.sleep(0.3)
        return FOUND

    run_id, key = await _submitted(engine, EffectKind.NON_IDEMPOTENT_WRITE)
    # When two reconcilers sweep at the same moment
    tallies = await asyncio.gather(*(reconcile_unknown(engine, _kinds(slow), limit=10, clock=time.time)
                                     for _ in range(2)))
    # Then one claimed, asked and confirmed; the other found nothing to claim
    assert sorted(sum(t.values()) for t in tallies) == [0, 1] and asked == [key]
    types = [t for t, _ in await _events(engine, run_id)]
    assert types.count("action.reconciliation_started") == 1 and types.count("action.reconciled") == 1


async def test_an_expired_lease_is_rewoken_once_and_taken_with_a_higher_fencing_token(clean, engine) -> None:
    # Given a run whose worker took it and then stopped renewing its lease
    stored = await _created(engine)
    run_id = stored.snapshot.run_id
    async with engine.begin() as conn:
        dead = await leases.take_lease(conn, run_id, "worker-dead", 0.2)
        assert dead is not None
        stored = await runs.append(conn, stored, [ev.RunStatusChanged(seq=stored.seq(1), at=time.time(),
                                                                      to=RunStatus.RUNNING, reason="taken")],
                                   fence=dead)
    await asyncio.sleep(0.5)
    # When the reconciler sweeps twice
    assert await rewake_expired_leases(engine, limit=10) == 1
    assert await rewake_expired_leases(engine, limit=10) == 0
    # Then the run got exactly one wakeup
    assert await _wakeups(engine, run_id, "lease expired") == 1
    # and the next worker takes it with a higher token, while the old holder can no longer write
    async with engine.begin() as conn:
        taken = await leases.take_lease(conn, run_id, "worker-b", 30)
    assert taken is not None and taken.token > dead.token
    with pytest.raises(LeaseLost):
        async with engine.begin() as conn:
            await runs.append(conn, stored, [ev.FactRecorded(seq=stored.seq(1), at=time.time(), key="late",
                                                             value="stale write", source="worker-dead")],
                              fence=dead)


@pytest.mark.parametrize("together", [True, False], ids=["together", "run_by_run"])
async def test_a_dead_workers_leases_are_cleared_in_one_sweep_and_only_open_runs_woken(
        clean, engine, monkeypatch, together) -> None:
    # Given two running runs whose worker died, one it had finished before dying, and one whose
    # worker is alive and renewing
    ttls = {"dead-a": 0.2, "dead-b": 0.2, "dead-finished": 0.2, "alive": 60.0}
    ids: dict[str, str] = {}
    for name, ttl in ttls.items():
        stored = await _created(engine)
        async with engine.begin() as conn:
            fence = await leases.take_lease(conn, stored.snapshot.run_id, f"worker-{name}", ttl)
            assert fence is not None
            stored = await runs.append(conn, stored, [ev.RunStatusChanged(
                seq=stored.seq(1), at=time.time(), to=RunStatus.RUNNING, reason="taken")], fence=fence)
            if name == "dead-finished":
                await runs.append(conn, stored, [ev.RunStatusChanged(
                    seq=stored.seq(1), at=time.time(), to=RunStatus.FAILED, reason="gave up")], fence=fence)
        ids[name] = stored.snapshot.run_id
    await asyncio.sleep(0.5)
    if not together:
        async def refuse(*_: Any, **__: Any) -> None:
            raise ValueError("a run that cannot be loaded together")

        monkeypatch.setattr(run_batches, "load_many", refuse)
    # When the reconciler sweeps once
    assert await rewake_expired_leases(engine, limit=10) == 2
    # Then every expired lease is cleared, the open runs are woken once, the finished one is not,
    # and the live lease is untouched
    for name, run_id in ids.items():
        async with engine.connect() as conn:
            stored = await runs.load(conn, run_id)
        assert stored is not None
        assert (stored.lease_owner is None) is (name != "alive"), name
        assert await _wakeups(engine, run_id, "lease expired") == int(name in ("dead-a", "dead-b")), name
    assert await rewake_expired_leases(engine, limit=10) == 0


async def test_a_silent_run_raises_exactly_one_alert(clean, engine) -> None:
    # Given a run READY for 1000 s with no worker, and a fresh one
    silent = (await _created(engine, at=time.time() - 1000)).snapshot.run_id
    await _created(engine)
    before = METRICS[f"{SILENT_ALERT}.READY"]
    # When two reconciler replicas sweep at once, and again later
    raised = await asyncio.gather(*(flag_silent_runs(engine, limits={RunStatus.READY: 600}) for _ in range(2)))
    again = await flag_silent_runs(engine, limits={RunStatus.READY: 600})
    # Then exactly one alert exists, for the silent run, and the counter moved once
    assert sum(raised) == 1 and again == 0
    alerts = await _rows(engine, "SELECT actor, target, details FROM audit_log WHERE action = :a", a=SILENT_ALERT)
    assert [(a.actor, a.target, a.details["status"]) for a in alerts] == [("reconciler", silent, "READY")]
    assert METRICS[f"{SILENT_ALERT}.READY"] == before + 1


async def test_drift_of_a_confirmed_action_is_reported_once_and_never_changes_the_run(clean, engine) -> None:
    # Given a confirmed action whose object the far side no longer has
    lookup, _ = _answer(None)
    # seq 5: after created, taken, prepared and submitted
    confirmed = [ev.ActionConfirmed(seq=5, at=time.time(), logical_action="pr", external_id="42")]
    run_id, key = await _submitted(engine, EffectKind.NON_IDEMPOTENT_WRITE, confirmed, ActionStatus.CONFIRMED,
                                   external_id="42", receipt=FOUND.receipt)
    before, _ = await _state(engine, run_id, key)
    # When drift is checked twice
    first = await check_drift(engine, _kinds(lookup), limit=10)
    second = await check_drift(engine, _kinds(lookup), limit=10)
    # Then one alert names the missing object, and the run is untouched
    assert (first.checked, first.drifted, second.drifted) == (1, 1, 0)
    alerts = await _rows(engine, "SELECT target, reason FROM audit_log WHERE action = :a", a=DRIFT_ALERT)
    assert len(alerts) == 1 and alerts[0].target == run_id and "missing" in alerts[0].reason
    after, _ = await _state(engine, run_id, key)
    assert after.snapshot == before.snapshot


@pytest.mark.parametrize(("found", "why"), [
    (ToolResult("43", {"id": 43, **REQUEST}), "the far side holds 43, the run recorded 42"),
    (None, "was counted done (42) but turned out missing from the far side")], ids=["another id", "missing"])
async def test_a_late_receipt_contradicting_a_completed_run_opens_a_correction_and_overwrites_nothing(
        clean, engine, found, why) -> None:
    # Given a run that COMPLETED counting its merge request 42 as done
    at = time.time()
    done = [ev.ActionConfirmed(seq=5, at=at, logical_action="pr", external_id="42"),
            ev.RunCompleted(seq=6, at=at, evidence=freeze({"merged": True}))]
    run_id, key = await _submitted(engine, EffectKind.NON_IDEMPOTENT_WRITE, done, ActionStatus.CONFIRMED,
                                   external_id="42", receipt=FOUND.receipt)
    before, row_before = await _state(engine, run_id, key)
    assert before.snapshot.status is RunStatus.COMPLETED
    # When the far side, asked later, answers otherwise under the action's key
    lookup, _ = _answer(found)
    first = await check_drift(engine, _kinds(lookup), limit=10)
    second = await check_drift(engine, _kinds(lookup), limit=10)
    # Then one correction is opened: a run.correction_needed event on the run, naming the action and why
    assert (first.drifted, second.drifted) == (1, 0)
    after, row_after = await _state(engine, run_id, key)
    corrections = [data for type_, data in await _events(engine, run_id) if type_ == "run.correction_needed"]
    assert len(corrections) == 1 and corrections[0]["logical_action"] == "pr" and why in corrections[0]["reason"]
    assert corrections[0]["evidence"]["recorded_external_id"] == "42"
    # and an alert for a person
    alerts = await _rows(engine, "SELECT actor, target, reason FROM audit_log WHERE action = :a", a=CORRECTION_ALERT)
    assert [(a.actor, a.target) for a in alerts] == [("reconciler", run_id)] and why in alerts[0].reason
    # and a public broadcast of it
    sent = [r.payload for r in await _rows(engine, "SELECT payload FROM outbox WHERE aggregate_id = :r "
                                                   "AND type = 'run.event'", r=run_id)]
    broadcast = [m for m in sent if m["payload"]["event_type"] == "run.correction_needed"]
    assert len(broadcast) == 1 and broadcast[0]["data_class"] == "public"
    assert broadcast[0]["payload"]["status"] == "COMPLETED" and broadcast[0]["payload"]["data"]["logical_action"] == "pr"
    # and nothing the run did is overwritten: still COMPLETED, the action still CONFIRMED as 42, ledger untouched
    assert after.snapshot.status is RunStatus.COMPLETED
    assert after.snapshot.replace(revision=before.snapshot.revision, last_seq=before.snapshot.last_seq) == \
        before.snapshot
    assert (row_after.status, row_after.external_id) == (row_before.status, row_before.external_id) == (
        ActionStatus.CONFIRMED.value, "42")


async def test_a_message_dead_lettered_by_the_broker_lands_in_quarantine_with_its_reason(clean, engine, bus) -> None:
    # Given the ingester consuming the quarantine queue
    ingester = asyncio.create_task(ingest_quarantine_queue(bus, engine, delivery_limit=DELIVERY_LIMIT))
    try:
        # When a wakeup is rejected by its consumer until the broker's delivery limit dead-letters it
        poison = wakeup("run-poison", "w-poison")
        await publish(bus, poison)
        queue = topology.partition_queue("worker", topology.partition_of("run-poison", PARTITIONS))
        assert bus.connection is not None
        channel = await bus.connection.channel()
        deliveries: list[int] = []

        async def reject(message: Any) -> None:
            deliveries.append(message.headers.get("x-delivery-count", 0))
            await message.nack(requeue=True)

        await (await channel.get_queue(queue, ensure=False)).consume(reject)
        # Then it is kept with the broker's reason, its queue, owner and death times, and acked
        rows = await eventually(lambda: _rows(engine, "SELECT * FROM quarantine"), what="a quarantine row")
        assert len(rows) == 1
        row = rows[0]
        assert (row.queue, row.owner, row.message_id, row.message_type) == (
            queue, "worker", poison.event_id, "run.wakeup")
        assert row.error_code == "delivery_limit" and "delivery_limit" in row.reason
        assert row.attempts == DELIVERY_LIMIT + 1 and row.first_failure_at <= row.last_failure_at
        assert row.headers["x-first-death-reason"] == "delivery_limit"
        assert len(deliveries) == DELIVERY_LIMIT + 1
    finally:
        ingester.cancel()
        await asyncio.gather(ingester, return_exceptions=True)
    # and acked: with the ingester gone, nothing went back to the queue
    dead_letters = await channel.declare_queue(topology.QUARANTINE_QUEUE, passive=True)
    assert dead_letters.declaration_result.message_count == 0
    await channel.close()


async def test_a_wakeup_dead_lettered_after_its_consumers_kept_dying_wakes_its_run_again_a_few_times(
        clean, engine, bus) -> None:
    # Given an open run with no lease, and the ingester consuming the quarantine queue
    run_id = (await _created(engine)).snapshot.run_id
    ingester = asyncio.create_task(ingest_quarantine_queue(bus, engine, delivery_limit=DELIVERY_LIMIT))
    try:
        # When its wakeup goes back to the queue until the broker's delivery limit dead-letters it
        # (as when the workers holding it prefetched are killed, one after the other)
        queue = topology.partition_queue("worker", topology.partition_of(run_id, PARTITIONS))
        assert bus.connection is not None
        channel = await bus.connection.channel()

        async def handed_back(message: Any) -> None:
            await message.nack(requeue=True)

        await (await channel.get_queue(queue, ensure=False)).consume(handed_back)
        await publish(bus, wakeup(run_id, "w-stranded-1"))
        # Then it is kept in quarantine, and the run is woken again with a fresh wakeup
        await eventually(lambda: _rows(engine, "SELECT id FROM quarantine"), what="a quarantine row")
        rewakes = await eventually(lambda: _rows(
            engine, "SELECT payload FROM outbox WHERE type = 'run.wakeup' AND aggregate_id = :r", r=run_id),
            what="a new wakeup")
        assert [outbox.envelope_of("run.wakeup", r.payload)["payload"]["reason"] for r in rewakes] == [
            "wakeup dead-lettered"]
        # And when every wakeup of the run keeps dying (one that kills each worker that takes it)
        for n in range(2, REWAKES_AFTER_DEAD_LETTER + 3):
            await publish(bus, wakeup(run_id, f"w-stranded-{n}"))
        await eventually(lambda: _has_rows(engine, "SELECT id FROM quarantine", REWAKES_AFTER_DEAD_LETTER + 2),
                         what="every wakeup in quarantine")
        # Then it is woken again only REWAKES_AFTER_DEAD_LETTER times, then left to an operator
        rewakes = await _rows(engine, "SELECT id FROM outbox WHERE type = 'run.wakeup' AND aggregate_id = :r",
                              r=run_id)
        assert len(rewakes) == REWAKES_AFTER_DEAD_LETTER
        await channel.close()
    finally:
        ingester.cancel()
        await asyncio.gather(ingester, return_exceptions=True)


async def _has_rows(engine: AsyncEngine, sql: str, n: int) -> bool:
    return len(await _rows(engine, sql)) >= n


# -- over the real ensemble ------------------------------------------------------------------------


def _start_ensemble(ensemble: Ensemble, tmp: Path, *, worker_env: dict[str, str]) -> None:
    common = {"LONGRUN_FORGE_TIMEOUT": "2", "LONGRUN_RECONCILE_INTERVAL": "0.5",
              "LONGRUN_ARTIFACT_DIR": str(tmp / "artifacts")}
    services = [("gateway", "longrun.services.gateway"), ("scheduler", "longrun.services.scheduler"),
                ("reconciler", "longrun.services.reconciler"), ("relay", "longrun.services.outbox_relay")]
    if (ROOT / "services" / "timer").is_dir():
        services.append(("timer", "longrun.services.timer"))
    for name, module in services:
        ensemble.start(name, module, **common)
    ensemble.start("worker", "longrun.services.worker", **{**common, **worker_env})


async def _run_to_the_end(engine: AsyncEngine, ensemble: Ensemble, bus: Bus, *,
                          on_the_way: Callable[[], Awaitable[None]] | None = None,
                          workflow_version: str | None = None) -> str:
    """Publish the upgrade task (pinned to ``workflow_version``, else the newest), approve the merge request
    when asked, return the run once it finished."""
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_=goal(key[-8:]), workflow_version=workflow_version)
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), timeout=30, what="the run")
    approved = False

    async def finished() -> bool:
        nonlocal approved
        async with engine.connect() as conn:
            stored = await runs.load(conn, run_id)
        assert stored is not None
        wait = stored.snapshot.wait
        if stored.snapshot.status is RunStatus.WAITING_USER and wait is not None and not approved:
            async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as gateway:
                (await gateway.post(f"/runs/{run_id}/approve", json={
                    "approval_id": wait.approval_id, "approved_hash": wait.approved_hash,
                    "reason": "diff, CI and cost reviewed"},
                    headers=await bearer(engine, wait.owner or "user_42"))).raise_for_status()
            approved = True
        if on_the_way is not None:
            await on_the_way()
        return stored.snapshot.status in TERMINAL

    await eventually(finished, timeout=75, interval=0.2, what="the run to finish")
    return run_id


def _mr_trail(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The merge request's action events, the outcome of each reconciliation, and the completion."""
    trail = []
    for type_, data in events:
        if data.get("logical_action") == MR:
            trail.append(f"{type_}({data['outcome']})" if type_ == "action.reconciled" else type_)
        elif type_ == "run.completed":
            trail.append(type_)
    return trail


async def _merge_requests(ensemble: Ensemble) -> int:
    return sum(e["count"] for e in await ensemble.forge_effects() if e["kind"] == "merge_request")


@pytest.mark.parametrize("version", ["1", "2"], ids=["decide-style", "code-first"])
@pytest.mark.long
async def test_forge_times_out_after_creating_the_mr_and_the_reconciler_confirms_it(
        clean, engine, bus, services, tmp_path, version: str) -> None:
    # Given the ensemble, with a forge that holds its answer after creating the merge request
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_forge()
    await ensemble.configure_forge(faults=({"endpoint": "merge_requests", "mode": "timeout_after_commit",
                                            "times": 1, "hold_seconds": 15},))
    _start_ensemble(ensemble, tmp_path, worker_env={})
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    # When the upgrade task runs to its end, on the decide-style agent (1) or the code-first one (2)
    run_id = await _run_to_the_end(engine, ensemble, bus, workflow_version=version)
    # Then the worker left the outcome unknown, the reconciler found the MR by key, and the run completed
    async with engine.connect() as conn:
        stored = await runs.load(conn, run_id)
        row = next(r for r in await ledger.for_run(conn, run_id) if r.logical_action == MR)
    assert stored is not None and stored.snapshot.status is RunStatus.COMPLETED, stored.snapshot.terminal_reason
    assert stored.snapshot.versions.workflow == version
    events = await _events(engine, run_id)
    assert _mr_trail(events) == ["action.prepared", "action.submitted", "action.unknown",
                                 "action.reconciliation_started", "action.reconciled(CONFIRMED)", "run.completed"]
    reconciled = next(d for t, d in events if t == "action.reconciled")
    assert reconciled["note"] == FOUND_NOTE
    # with exactly one merge request on the forge, submitted once, its receipt where decide reads it
    assert await _merge_requests(ensemble) == 1
    assert (row.status, row.attempts, row.external_id) == ("CONFIRMED", 1, reconciled["external_id"])
    receipt = stored.snapshot.fact(f"receipt:{MR}")
    assert receipt is not None and receipt.source == "tool:forge.create_merge_request"
    assert str(dict(receipt.value)["id"]) == row.external_id


@pytest.mark.long
async def test_worker_killed_before_sending_the_mr_it_is_resubmitted_once_under_the_same_key(
        clean, engine, bus, services, tmp_path) -> None:
    # Given the ensemble, with a worker that dies right before its 6th tool request: branch,
    # commit:1, ci:1 (the forge fails the first CI run), commit:2, ci:2, then the merge request;
    # its calls' start-to-close is longer than its run lease, so the run is recovered, by its lease's
    # expiry or its worker's lapsed membership, before the call's timer
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_forge()
    await ensemble.configure_forge()
    _start_ensemble(ensemble, tmp_path, worker_env={"LONGRUN_CRASH_POINTS": "worker.before_tool_request:6",
                                                    "LONGRUN_FORGE_TIMEOUT": "30"})
    crashing = services.started[-1]
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")

    async def replace_the_dead_worker() -> None:
        if not crashing.alive() and len([p for p in services.started if p.name.startswith("worker")]) == 1:
            assert crashing.popen.returncode == -9, crashing.output()
            ensemble.start("worker", "longrun.services.worker", LONGRUN_FORGE_TIMEOUT="2",
                           LONGRUN_ARTIFACT_DIR=str(tmp_path / "artifacts"))

    # When the task runs, and the dead worker is replaced by a fresh one
    run_id = await _run_to_the_end(engine, ensemble, bus, on_the_way=replace_the_dead_worker)
    # Then the abandoned run was recovered once, found unsubmitted, and resubmitted under the same key
    async with engine.connect() as conn:
        stored = await runs.load(conn, run_id)
        row = next(r for r in await ledger.for_run(conn, run_id) if r.logical_action == MR)
    assert stored is not None and stored.snapshot.status is RunStatus.COMPLETED, stored.snapshot.terminal_reason
    assert not crashing.alive()
    assert _mr_trail(await _events(engine, run_id)) == [
        "action.prepared", "action.submitted", "action.unknown", "action.reconciliation_started",
        "action.reconciled(RETRYABLE)", "action.submitted", "action.confirmed", "run.completed"]
    taken_over = sum(p.output().count(f"run {run_id}: taken over from {crashing.name}") for p in services.started
                     if p.name.startswith("worker"))
    assert await _wakeups(engine, run_id, "lease expired") + taken_over == 1
    assert await _merge_requests(ensemble) == 1
    assert (row.status, row.attempts) == ("CONFIRMED", 2)
    # and the second submission was written under a newer lease than the first
    tokens = [r.fencing_token for r in await _rows(
        engine, "SELECT fencing_token FROM run_events WHERE run_id = :r AND type = 'action.submitted' "
                "AND data->>'logical_action' = :a ORDER BY seq", r=run_id, a=MR)]
    assert len(tokens) == 2 and tokens[1] > tokens[0]


@pytest.mark.long
async def test_an_expired_lease_is_rewoken_when_it_runs_out_not_a_round_later(clean, engine, services) -> None:
    # Given a running run whose worker holds a lease for a few more seconds and then stops renewing it
    stored = await _created(engine)
    run_id = stored.snapshot.run_id
    async with engine.begin() as conn:
        dead = await leases.take_lease(conn, run_id, "worker-dead", 6)
        assert dead is not None
        await runs.append(conn, stored, [ev.RunStatusChanged(seq=stored.seq(1), at=time.time(),
                                                             to=RunStatus.RUNNING, reason="taken")], fence=dead)
        lease_until = (await conn.execute(text("SELECT lease_until FROM runs WHERE run_id = :r"),
                                          {"r": run_id})).scalar_one()
    # When the reconciler runs with its rounds 60 s apart
    services.start("reconciler", "longrun.services.reconciler", LONGRUN_RECONCILE_INTERVAL="60")
    # Then the run is re-woken as its lease runs out, not at the next round
    await eventually(lambda: _has_wakeup(engine, run_id), timeout=20, what="the run re-woken")
    rows = await _rows(engine, "SELECT created_at FROM outbox WHERE aggregate_id = :r AND type = 'run.wakeup'",
                       r=run_id)
    [late] = [(r.created_at - lease_until).total_seconds() for r in rows]
    assert 0 < late < 0.5


async def _has_wakeup(engine: AsyncEngine, run_id: str) -> bool:
    return await _wakeups(engine, run_id, "lease expired") == 1
