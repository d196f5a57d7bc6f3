"""Admission's candidate query against the domain: seeded random tenants (admitted runs in every
open status and finished ones, queued runs of random priority and age, paused, cancelling and
finished runs never admitted, runs parked on a far side's health holding no slot and runs woken from
there, queued again; some tenants with slots of their own, one with its budget spent) put
through ONE admission round (``admitting.admit``: ``ADMIT_BEST`` per
tenant) and then one creation per tenant admitted at once when its tenant has room
(``runs.create`` with ``AtOnce``: ``tenant_slots``), all in one transaction. Compared column by column
with a pure model: slots held by admitted runs whose status is not in the domain's ``TERMINAL``, the
queue as the runs in ``READY`` not admitted, the best by priority plus age over ``aging`` passing over a
run whose concurrency key its holders fill (a queued run holding its key passes), and the wakeups from
``effects.wake_message_of``.

The mutants change a status set (the domain's, or the one the SQL is rendered from), what the SQL
counts as holding a slot or queued, or drop the key rules from the SQL, and expect the differential
check to report mismatches.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun.app import effects
from longrun.app.scheduler import admit
from longrun.bus import topology
from longrun.db import admission, run_batches, runs
from longrun.db.schema import sql_names
from longrun.domain import PinnedVersions, RunStatus, Usage, Wait, WakeReason, evolve, freeze
from longrun.domain import events as ev
from longrun.domain.concurrency import KeyClaim
from longrun.domain import run as domain_run
from longrun.domain.breaker import health_wait
from longrun.ports.runs import StoredRun
from longrun.services.scheduler import admitting
from tests.fixtures import PARTITIONS
from tests.integration import differential as diff

pytestmark = pytest.mark.integration

PRODUCER = admit.PRODUCER
VERSIONS = PinnedVersions(workflow="1", prompt="1", model_policy="1", tool_schemas="1")
TENANTS = ("a-red", "a-green", "a-blue", "a-amber", "a-grey")
NEW_TENANT = "a-new"
KEYED_TENANT = "a-keys"
SLOTS = 3
AGING = 7.3
"""Seconds per priority point. Ages are whole seconds below 73 apart, so no two scores tie or nearly tie."""
"""A created run's status (``lifecycle.created``): not admitted, it waits in the queue."""
_S = RunStatus
HOLDING = ("ready", "running", "waiting", "needs_attention", "paused")
"""How an admitted run may hold its slot."""
PARKED = ("parked", "requeued")
"""How an admitted run may give its slot back (``domain.slots``): parked on a far side's health, or
woken from there, queued again."""
FINISHED = ("failed", "timed_out", "terminated", "completed", "cancelled", "budget_exhausted")
ASIDE = ("paused", "timed_out", "terminated", "cancelling")
"""How a run never admitted may be out of the queue."""


def _events(kind: str, stored: StoredRun, at: float) -> list[ev.RunEvent]:
    """The events that take a READY run to ``kind``."""
    seq = stored.seq

    def running(*then: ev.RunEvent) -> list[ev.RunEvent]:
        return [ev.RunStatusChanged(seq=seq(1), at=at, to=_S.RUNNING, reason="taken"), *then]
    match kind:
        case "ready":
            return []
        case "running":
            return running()
        case "waiting":
            return running(ev.WaitStarted(seq=seq(2), at=at, status=_S.WAITING_EVENT, wait=Wait(
                f"w-{stored.snapshot.run_id}", "ci", at + 3600, correlation_key=f"ci:{stored.snapshot.run_id}")))
        case "parked":
            wait = health_wait(wait_id=f"h-{stored.snapshot.run_id}", far_side="forge", logical_action="open",
                               now=at, max_wait=60)
            return running(ev.WaitStarted(seq=seq(2), at=at, status=_S.RETRY_SCHEDULED, wait=wait))
        case "woken":  # a parked run's wait ends (its own write, as the reconciler's)
            parked = stored.snapshot.wait
            assert parked is not None
            return [ev.RunWoken(seq=seq(1), at=at, wait_id=parked.wait_id, reason=WakeReason.EVENT,
                                correlation_key=parked.correlation_key)]
        case "needs_attention":
            return running(ev.RunStatusChanged(seq=seq(2), at=at, to=_S.NEEDS_ATTENTION, reason="stuck"))
        case "failed":
            return running(ev.RunStatusChanged(seq=seq(2), at=at, to=_S.FAILED, reason="gave up"))
        case "completed":
            return running(ev.RunCompleted(seq=seq(2), at=at, evidence=freeze({"ok": True})))
        case "budget_exhausted":
            return running(ev.BudgetCharged(seq=seq(2), at=at, model_calls=11))
        case "cancelled":
            return [ev.CancelRequested(seq=seq(1), at=at, by="user", reason="no longer needed"),
                    ev.RunStatusChanged(seq=seq(2), at=at, to=_S.CANCELLED, reason="cancelled")]
        case "cancelling":
            return [ev.CancelRequested(seq=seq(1), at=at, by="user", reason="no longer needed")]
        case "paused":
            return [ev.RunPaused(seq=seq(1), at=at, by="operator", reason="hold")]
        case "timed_out":
            return [ev.RunStatusChanged(seq=seq(1), at=at, to=_S.TIMED_OUT, reason="schedule_to_start: late")]
        case "terminated":
            return [ev.RunTerminated(seq=seq(1), at=at, by="operator", reason="incident")]
    raise AssertionError(kind)


KEYS = ("repo:a", "repo:b", "repo:c")


def _key(rng: random.Random) -> KeyClaim | None:
    """Half the runs take one of a few concurrency keys, of limit one or two."""
    return KeyClaim(rng.choice(KEYS), rng.choice((1, 2))) if rng.random() < 0.5 else None


def _created(rng: random.Random, tenant: str, n: int, *, priority: int, at: float) -> ev.RunCreated:
    run_id = f"run-{rng.getrandbits(32):08x}-{tenant}-{n:02d}"
    return ev.RunCreated(seq=1, at=at, run_id=run_id, tenant_id=tenant, kind="probe", goal=freeze({"n": n}),
                         versions=VERSIONS, budget=Usage(model_calls=10, tool_calls=10, cost=1.0), priority=priority,
                         labels=freeze({"team": tenant}), correlation_id=f"corr-{run_id}")


async def _create(conn: AsyncConnection, created: ev.RunCreated, **kwargs: Any) -> StoredRun | None:
    return await runs.create(conn, created, idempotency_key=created.run_id, input_hash="h",
                             partition=topology.partition_of(created.run_id, PARTITIONS), **kwargs)


async def _make_cases(engine: AsyncEngine, rng: random.Random) -> None:
    """Per tenant: admitted runs holding their slot, finished, or parked in a wait that holds none
    (or woken from it, queued again), then queued runs and runs kept out of the queue, each with its
    own age. The first tenant always holds two slots of three (RUNNING and NEEDS_ATTENTION) next to
    an admitted run that finished (TIMED_OUT) and one parked on a far side's health, with four queued
    runs, a run queued again that scores best, and a paused one that would score better if it were
    queued."""
    at, ages = time.time(), {}
    async with engine.begin() as conn:
        for t, tenant in enumerate(TENANTS):
            first = t == 0
            kinds = (["running", "needs_attention", "timed_out", "parked", "requeued"] if first else
                     [rng.choice(HOLDING + PARKED) for _ in range(rng.randint(0, SLOTS + 1))]
                     + rng.sample(FINISHED, rng.randint(0, 2)))
            admitted = []
            for n, kind in enumerate(kinds):
                priority = 3 if first and kind == "requeued" else rng.randrange(4)
                # Each admitted run's key is its own within the tenant (the setup admits them all).
                key = KeyClaim(f"held:{n}", 1) if rng.random() < 0.3 else None
                stored = await _create(conn, _created(rng, tenant, n, priority=priority, at=at), key=key)
                assert stored is not None
                admitted.append(stored)
            await admitting.admit(conn, slots=100, aging_seconds=AGING, tenants=[tenant])
            for stored, kind in zip(admitted, kinds):
                if kind == "requeued":
                    stored = await runs.append(conn, stored, _events("parked", stored, at))
                    kind = "woken"
                await runs.append(conn, stored, _events(kind, stored, at))
            queued = []
            for n in range(4 if first else rng.randint(0, 6)):
                stored = await _create(conn, _created(rng, tenant, 20 + n, priority=rng.randrange(4), at=at),
                                       key=_key(rng))
                assert stored is not None
                queued.append(stored)
            aside = ["paused"] if first else rng.sample(ASIDE, rng.randint(0, 2))
            top = max([q.snapshot.priority for q in queued], default=0) + 2
            for n, kind in enumerate(aside):
                stored = await _create(conn, _created(rng, tenant, 40 + n, priority=top, at=at))
                assert stored is not None
                await runs.append(conn, stored, _events(kind, stored, at))
                ages[stored.snapshot.run_id] = 72  # the oldest: it would be the best if it were queued
            for n in range(1 if first else rng.randint(0, 2)):
                # Runs of a key an admitted run may hold: one holding it while queued (it gave its slot
                # back while it waited), and one held back by it that would otherwise be the best.
                key = KeyClaim("held:0", 1)
                holding = await _create(conn, _created(rng, tenant, 30 + 2 * n, priority=rng.randrange(4), at=at),
                                        key=key)
                blocked = await _create(conn, _created(rng, tenant, 31 + 2 * n, priority=top + 1, at=at), key=key)
                assert holding is not None and blocked is not None
                await conn.execute(text("UPDATE runs SET concurrency_held_at = now() WHERE run_id = :r"),
                                   {"r": holding.snapshot.run_id})
                queued.append(holding)
                ages[blocked.snapshot.run_id] = 71
            spare = rng.sample(range(1, 72), 71)
            for stored in [*admitted, *queued]:
                ages[stored.snapshot.run_id] = spare.pop()
            if first:  # the run queued again is the oldest of the queue and of the top priority: the best
                ages[admitted[kinds.index("requeued")].snapshot.run_id] = 72
        # A tenant with three free slots and three queued runs of one key of limit one, and a run without
        # a key: one round admits the best of the key's runs and the keyless one.
        for n in range(4):
            stored = await _create(conn, _created(rng, KEYED_TENANT, n, priority=rng.randrange(4), at=at),
                                   key=KeyClaim("repo:one", 1) if n else None)
            assert stored is not None
            ages[stored.snapshot.run_id] = 10 + n
        # Distinct ages, whole seconds: the queue's order by score, then age, has no near ties.
        await diff.set_ages(conn, ages)


async def _tenant_limits(engine: AsyncEngine, rng: random.Random) -> tuple[dict[str, int], set[str]]:
    """Some tenants' own slots (none, fewer or more than the platform's ``SLOTS``) and one tenant's
    budget spent for the period now running, stored; each tenant's slots, and the spent tenants."""
    every = (*TENANTS, NEW_TENANT)
    # Not the first tenant: its runs are the cases each mutant must show in (a spent budget hides them).
    own = {tenant: rng.choice((0, 1, SLOTS + 2)) for tenant in rng.sample(every[1:], 3)}
    spent = set(rng.sample(every[1:], 1))
    async with engine.begin() as conn:
        for tenant, n in own.items():
            await conn.execute(text("INSERT INTO tenant_limits (tenant_id, version, run_slots, updated_by) "
                                    "VALUES (:t, 1, :n, 'tests')"), {"t": tenant, "n": n})
        for tenant in spent:
            await conn.execute(text(
                "INSERT INTO tenant_budget_use (tenant_id, period_start, period_end, tokens, cost, spent) "
                "VALUES (:t, now() - interval '1 hour', now() + interval '1 hour', 10, 0, true)"), {"t": tenant})
    return {tenant: own.get(tenant, SLOTS) for tenant in every}, spent


async def admission_mismatches(engine: AsyncEngine, *, seed: int,
                               mutate: Callable[[], None] | None = None) -> list[str]:
    """Seeded random tenants through one admission round and a creation each, in one transaction;
    what PostgreSQL stored that the domain's model would not have. ``mutate``: applied once the cases
    are stored."""
    rng = random.Random(seed)
    await _make_cases(engine, rng)
    async with engine.connect() as conn:
        ids = list((await conn.execute(text("SELECT run_id FROM runs ORDER BY run_id"))).scalars())
        before = await run_batches.load_many(conn, ids)
    if mutate is not None:
        mutate()
    slots, spent = await _tenant_limits(engine, rng)
    at = time.time()
    fresh = [_created(rng, tenant, 60, priority=rng.randrange(4), at=at) for tenant in (*TENANTS, NEW_TENANT)]
    fresh_keys = {created.run_id: _key(rng) for created in fresh}
    # The SQL path: one admission round, then a creation per tenant admitted at once if it has room.
    async with engine.begin() as conn:
        now = (await conn.execute(text("SELECT now()"))).scalar_one()
        mark = await diff.outbox_mark(conn)
        model = {r.run_id: diff.Row(r.tenant_id, RunStatus(r.status), r.admitted, r.priority, r.created_at, r.revision,
                               r.partition, r.concurrency_key, r.concurrency_limit or 0, r.key_held)
                 for r in await conn.execute(text(
                     "SELECT run_id, tenant_id, status, admitted_at IS NOT NULL AS admitted, priority, created_at, "
                     "revision, partition, concurrency_key, concurrency_limit, "
                     "concurrency_held_at IS NOT NULL AS key_held FROM runs"))}
        admitted = await admitting.admit(conn, slots=SLOTS, aging_seconds=AGING)
        made: dict[str, StoredRun | None] = {}
        for created in fresh:
            partition = topology.partition_of(created.run_id, PARTITIONS)
            wakeup = effects.wake_message_of(tenant_id=created.tenant_id, run_id=created.run_id,
                                             revision=evolve(None, created).revision, partition=partition,
                                             reason="admitted", producer=PRODUCER, cause=f"create:{created.run_id}")
            made[created.run_id] = await _create(conn, created, at_once=runs.AtOnce(SLOTS, wakeup,
                                                                                    effects.ADMISSION_CHANNEL),
                                                 key=fresh_keys[created.run_id])
    # The domain's path: each tenant with a queue gets its free slots' worth of its best queued runs,
    # passing over those whose concurrency key has no room (counting the runs admitted before them).
    expected_runs = dict(before)
    expected_messages: dict[str, list[Any]] = {}
    chosen: list[str] = []
    for tenant in sorted({row.tenant for row in model.values() if diff.queued(row)}):
        free = slots.get(tenant, SLOTS) - sum(1 for row in model.values() if row.tenant == tenant and diff.holds_slot(row))
        free = 0 if tenant in spent else free
        queue = [r for r, row in model.items() if row.tenant == tenant and diff.queued(row)]
        best = []
        for run_id in sorted(queue, key=lambda r: (-diff.score(model[r], now, AGING), model[r].created_at)):
            if len(best) < free and diff.key_free(model, model[run_id]):
                best.append(run_id)
                model[run_id] = replace(model[run_id], key_held=model[run_id].key is not None)
        for run_id in best:
            row = model[run_id] = replace(model[run_id], admitted=True)
            expected_runs[run_id] = replace(expected_runs[run_id], admitted=True)
            expected_messages[run_id] = [effects.wake_message_of(
                tenant_id=tenant, run_id=run_id, revision=row.revision, partition=row.partition,
                reason="admitted", producer=PRODUCER, cause=f"admission:{tenant}")]
        chosen += best
    # and a run created into a tenant with a free slot and nobody queued is admitted at once.
    expected_events: dict[str, list[dict[str, Any]]] = {r: [] for r in before}
    for created in fresh:
        tenant, run_id = created.tenant_id, created.run_id
        rows = [row for row in model.values() if row.tenant == tenant]
        claim = fresh_keys[run_id]
        snapshot = evolve(None, created)
        partition = topology.partition_of(run_id, PARTITIONS)
        row = diff.Row(tenant, snapshot.status, False, snapshot.priority, now, snapshot.revision, partition,
                       claim.key if claim else None, claim.limit if claim else 0)
        at_once = (sum(map(diff.holds_slot, rows)) < slots.get(tenant, SLOTS) and not any(map(diff.queued, rows))
                   and tenant not in spent and diff.key_free(model, row))
        model[run_id] = replace(row, admitted=at_once, key_held=at_once and claim is not None)
        expected_runs[run_id] = StoredRun(snapshot, created.seq, partition, None, None, 0, admitted=at_once)
        expected_events[run_id] = [diff.event_row(run_id, created, True)]
        if at_once:
            expected_messages[run_id] = [effects.wake_message_of(
                tenant_id=tenant, run_id=run_id, revision=snapshot.revision, partition=partition,
                reason="admitted", producer=PRODUCER, cause=f"create:{run_id}")]
    found = [] if admitted == chosen else [f"admission: admitted {admitted}, the domain {chosen}"]
    found += [f"run {r}: created {made[r] is not None}, admitted at once "
              f"{made[r] is not None and made[r].admitted}; the domain: {expected_runs[r].admitted}"
              for r in made if made[r] is None or made[r].admitted != expected_runs[r].admitted]
    async with engine.connect() as conn:
        stored_rows = await diff.stored_runs(conn, expected_runs)
        events = await diff.stored_events(conn, {r: s.stored_seq for r, s in before.items()} | dict.fromkeys(made, 0))
        sent = await diff.stored_messages(conn, mark)
    if [r["aggregate_id"] for r in sent] != [r for r in [*chosen, *made] if r in expected_messages]:
        found.append(f"outbox: wakeups in order {[r['aggregate_id'] for r in sent]}, the domain's "
                     f"{[r for r in [*chosen, *made] if r in expected_messages]}")
    found += [f"run {run_id}: admitted_at {row['admitted_at']} is not the round's {now}"
              for run_id, row in sorted(stored_rows.items())
              if (run_id in chosen or run_id in made) and row["admitted"] and row["admitted_at"] != now]
    async with engine.connect() as conn:
        held = dict((await conn.execute(text(
            "SELECT run_id, concurrency_held_at IS NOT NULL FROM runs WHERE concurrency_key IS NOT NULL"))).all())
    found += [f"run {run_id}: holds its concurrency key {held.get(run_id)}, the domain {row.key_held}"
              for run_id, row in sorted(model.items()) if row.key is not None and held.get(run_id) != row.key_held]
    return found + diff.compare_stored(expected_runs, expected_events, expected_messages, stored_rows, events, sent)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_admission_stores_what_the_domain_makes_of_every_tenant(clean, engine, seed) -> None:
    started = time.monotonic()
    assert await admission_mismatches(engine, seed=seed) == []
    assert time.monotonic() - started < 20


def _timed_out_holds_a_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(domain_run, "TERMINAL", domain_run.TERMINAL - {_S.TIMED_OUT})


def _needs_attention_frees_its_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(domain_run, "TERMINAL", domain_run.TERMINAL | {_S.NEEDS_ATTENTION})


def _sql_counts_timed_out_as_holding(monkeypatch: pytest.MonkeyPatch) -> None:
    retyped = sql_names(sorted(domain_run.TERMINAL - {_S.TIMED_OUT}))
    monkeypatch.setattr(admitting, "ROOM", text(
        "SELECT count(*) AS active, CAST(:slots AS integer) AS slots, false AS spent FROM runs "
        f"WHERE tenant_id = :t AND admitted_at IS NOT NULL AND status NOT IN ({retyped})"))


def _sql_queue_takes_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "QUEUED",
                        f"admitted_at IS NULL AND status IN ({sql_names((_S.READY, _S.PAUSED))})")
    monkeypatch.setattr(admission, "ADMIT_BEST", admission.admit_best())


def _sql_counts_parked_as_holding(monkeypatch: pytest.MonkeyPatch) -> None:
    finished = sql_names(sorted(domain_run.TERMINAL))
    monkeypatch.setattr(admission, "ADMITTED_OPEN", "tenant_id = {tenant} AND (admitted_at IS NOT NULL "
                                                    f"OR wait_kind IS NOT NULL) AND status NOT IN ({finished})")
    monkeypatch.setattr(admitting, "ROOM", text(admission.tenant_slots(":t")))


def _sql_queue_of_runs_never_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "QUEUED", f"admitted_at IS NULL AND status = {sql_names((_S.READY,))} "
                                             "AND jsonb_typeof(snapshot -> 'last_wake') IS DISTINCT FROM 'object'")
    monkeypatch.setattr(admission, "ADMIT_BEST", admission.admit_best())


def _sql_ignores_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "key_free", lambda run, ended_key=None: "TRUE")
    monkeypatch.setattr(admission, "ADMIT_BEST", admission.admit_best())


def _admission_keeps_what_one_statement_took(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs that took one key in one statement each saw the room it had before: none is given back."""
    async def nothing_past(conn: AsyncConnection, tenant: str, rows: Any) -> set[str]:
        return set()
    monkeypatch.setattr(admitting, "_past_room", nothing_past)


MUTANTS: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], str]] = {
    # Runs parked in a wait (admitted_at cleared or not) counted as holding their slot.
    "sql-holding-counts-parked-runs": (_sql_counts_parked_as_holding, "admitted: sql False != domain True"),
    # The queue retyped as runs never woken: a run queued again after its wait is never admitted.
    "sql-queue-without-runs-queued-again": (_sql_queue_of_runs_never_started, "admitted: sql False != domain True"),
    # The domain's status set: TIMED_OUT no longer finishes a run; the SQL still counts it as finished.
    "domain-terminal-set-without-timed-out": (_timed_out_holds_a_slot, "admitted: sql True != domain False"),
    # The domain's status set: NEEDS_ATTENTION finishes a run; the SQL still counts it as holding a slot.
    "domain-terminal-set-with-needs-attention": (_needs_attention_frees_its_slot,
                                                 "admitted: sql False != domain True"),
    # The status set the SQL is rendered from, retyped without TIMED_OUT: such runs hold their slot.
    "sql-terminal-set-without-timed-out": (_sql_counts_timed_out_as_holding, "admitted: sql False != domain True"),
    # The queue's status set the SQL is rendered from, retyped with PAUSED.
    "sql-queued-set-with-paused": (_sql_queue_takes_paused, "admitted: sql True != domain False"),
    # Admission's candidates no longer pass over a run whose concurrency key has no room.
    "sql-ignores-concurrency-keys": (_sql_ignores_keys, "admitted: sql True != domain False"),
    # One statement admits as many runs of a key as it has candidates.
    "admission-keeps-a-key-taken-past-its-room": (_admission_keeps_what_one_statement_took,
                                                  "admitted: sql True != domain False"),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
async def test_a_mutant_of_the_domain_or_the_candidate_query_is_caught(clean, engine, monkeypatch,
                                                                       mutant) -> None:
    mutate, symptom = MUTANTS[mutant]
    try:
        mismatches = await admission_mismatches(engine, seed=1, mutate=lambda: mutate(monkeypatch))
    finally:
        monkeypatch.undo()
        await diff.wipe(engine)
    assert mismatches, f"mutant {mutant} survived"
    assert any(symptom in m for m in mismatches), mismatches[:10]
