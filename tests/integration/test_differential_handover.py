"""The handover against the domain: seeded random tenants (slots, some as limits of their own, one
with its budget spent; admitted runs holding them or finished, queued runs of random priority and age,
paused and finished runs that are not queued) whose admitted runs finish, or park, one after another in
ONE transaction, each such write carrying its
``runs.Handover`` (``effects.broadcast_rides``), so PostgreSQL picks and admits the tenant's best
queued run and keeps its wakeup as data (``bus.wakeup``), rendered as the relay publishes it. Compared column by column with a pure model:
the finishing transitions through ``ports.runs.plan`` (``evolve``), slots held by admitted runs whose
status is not in the domain's ``TERMINAL`` (a run parked in a wait of the model's own slotless kinds
admitted no more, handing its slot on as a finish does), the queue as the runs in ``READY`` not
admitted, the best by priority plus age over ``aging`` passing over a run whose concurrency key its
holders fill (the finishing run's key counted as given back), taken only if it has no key, holds it,
or takes the one given back, and the wakeup from ``effects.wake_message_of``.

The mutants change a status set (the domain's, or the one the SQL is rendered from), the domain's
slotless waits, the parking statement, an envelope field the wakeup builder sets, or the handover's
key rules, and expect the differential check to report mismatches.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun.app import effects
from longrun.bus import topology
from longrun.db import admission, handover, keys, leases, run_batches, runs
from longrun.db.schema import sql_names
from longrun.domain import PinnedVersions, RunStatus, Usage, Wait, freeze
from longrun.domain import events as ev
from longrun.domain.concurrency import KeyClaim
from longrun.domain import run as domain_run
from longrun.domain import slots
from longrun.ports.runs import Fence, StoredRun, plan
from longrun.services.scheduler import admitting
from tests.fixtures import PARTITIONS
from tests.integration import differential as diff

pytestmark = pytest.mark.integration

PRODUCER = "worker"
VERSIONS = PinnedVersions(workflow="1", prompt="1", model_policy="1", tool_schemas="1")
TENANTS = ("h-red", "h-green", "h-blue", "h-amber", "h-grey", "h-teal")
AGING = 7.3
"""Seconds per priority point. Ages are whole seconds below 73 apart, so no two scores tie or nearly tie."""
"""A created run's status (``lifecycle.created``): not admitted, it waits in the queue."""
_S = RunStatus
_FINISHES = ("failed", "timed_out", "terminated", "completed")
_PARKS = ("tool_healthy", "rate_limit", "sleep")
"""Waits a run parks in while it is admitted: the first two hold no slot, a sleep holds its slot."""


@dataclass
class Case:
    """A tenant's runs as the setup made them."""

    tenant: str
    slots: int
    finishing: list[str]
    """Run ids finishing in the batch, in order."""


def _event(kind: str, stored: StoredRun, at: float) -> ev.RunEvent:
    seq = stored.seq(1)
    if kind == "failed":
        return ev.RunStatusChanged(seq=seq, at=at, to=_S.FAILED, reason="gave up")
    if kind == "timed_out":
        return ev.RunStatusChanged(seq=seq, at=at, to=_S.TIMED_OUT, reason="business_deadline: passed")
    if kind == "terminated":
        return ev.RunTerminated(seq=seq, at=at, by="operator", reason="incident")
    if kind == "completed":
        return ev.RunCompleted(seq=seq, at=at, evidence=freeze({"ok": True}))
    if kind == "running":
        return ev.RunStatusChanged(seq=seq, at=at, to=_S.RUNNING, reason="taken")
    if kind == "needs_attention":
        return ev.RunStatusChanged(seq=seq, at=at, to=_S.NEEDS_ATTENTION, reason="stuck")
    if kind == "paused":
        return ev.RunPaused(seq=seq, at=at, by="operator", reason="hold")
    if kind in _PARKS:
        wait = Wait(f"w-{kind}-{seq}", kind, at + 60, correlation_key=f"{kind}:far-side", wake_at=at + 60)
        return ev.WaitStarted(seq=seq, at=at, status=_S.RETRY_SCHEDULED, wait=wait)
    assert kind == "waiting"
    return ev.WaitStarted(seq=seq, at=at, status=_S.WAITING_EVENT,
                          wait=Wait(f"w-{stored.snapshot.run_id}", "ci", at + 3600, correlation_key=f"ci:{seq}"))


async def _create(conn: AsyncConnection, rng: random.Random, tenant: str, n: int, *, priority: int,
                  at: float, key: KeyClaim | None = None) -> StoredRun:
    run_id = f"run-{rng.getrandbits(32):08x}-{tenant}-{n:02d}"
    created = ev.RunCreated(seq=1, at=at, run_id=run_id, tenant_id=tenant, kind="probe", goal=freeze({"n": n}),
                            versions=VERSIONS, budget=Usage(model_calls=10, tool_calls=10, cost=1.0),
                            priority=priority, stage=rng.choice(("", "review")),
                            labels=freeze({"team": tenant}), correlation_id=rng.choice((None, f"corr-{run_id}")))
    stored = await runs.create(conn, created, idempotency_key=run_id, input_hash="h",
                               partition=topology.partition_of(run_id, PARTITIONS), key=key)
    assert stored is not None
    return stored


def _queued_key(rng: random.Random, running: int) -> KeyClaim | None:
    """A queued run's concurrency key: none, one a finishing run may hand on, or one of the tenant's own."""
    return rng.choice((None, None, KeyClaim(f"held:{rng.randrange(max(running, 1))}", 1),
                       KeyClaim("repo:x", rng.choice((1, 2)))))


async def _make_cases(engine: AsyncEngine, rng: random.Random) -> tuple[list[Case], dict[str, Fence]]:
    """Per tenant: admitted runs (running, to finish; holding their slot; finished already), then queued
    runs and runs that are neither (paused, finished while queued, one finishing in the batch). The
    first tenant always has two runs finishing into a queue behind a run that finished before
    (TIMED_OUT), with a paused unadmitted run that would score best if it were queued."""
    cases, fences, ages = [], {}, {}
    at = time.time()
    async with engine.begin() as conn:
        for t, tenant in enumerate(TENANTS):
            first = t == 0
            slots = 2 if first else rng.randint(1, 3)
            running = 2 if first else rng.randint(1, slots + 2)
            holding = [] if first else rng.sample(("needs_attention", "waiting", "running"), rng.randint(0, 1))
            done = ["timed_out"] if first else rng.sample(_FINISHES, rng.randint(0, 2))
            # Each admitted run's key is its own within the tenant (the setup admits them all).
            admitted = [await _create(conn, rng, tenant, n, priority=rng.randrange(4), at=at,
                                      key=KeyClaim(f"held:{n}", 1) if first or rng.random() < 0.5 else None)
                        for n in range(running + len(holding) + len(done))]
            await admitting.admit(conn, slots=100, aging_seconds=AGING, tenants=[tenant])
            finishing = []
            for n, stored in enumerate(admitted):
                stored = await runs.append(conn, stored, [_event("running", stored, at)])
                if n < running:
                    finishing.append(stored.snapshot.run_id)
                    if rng.random() < 0.6:  # a worker's write, fenced, releasing its lease
                        fence = await leases.take_lease(conn, stored.snapshot.run_id, f"w-{n}", ttl=60)
                        assert fence is not None
                        fences[stored.snapshot.run_id] = fence
                    continue
                kind = [*holding, *done][n - running]
                if kind != "running":  # a running run that does not finish in the batch holds its slot as it is
                    await runs.append(conn, stored, [_event(kind, stored, at)])
            queued = [await _create(conn, rng, tenant, 20 + n, priority=rng.randrange(4), at=at,
                                    key=None if first else _queued_key(rng, running))
                      for n in range(4 if first else rng.randint(0, 6))]
            if first:
                # The best queued run waits for the key of the first finishing run, which a paused run
                # holds as well (its limit was lowered): the key stays full once that run ends. Behind
                # it, a run holding its own key while queued (it gave its slot back).
                queued.append(await _create(conn, rng, tenant, 30, priority=9, at=at, key=KeyClaim("held:0", 1)))
                queued.append(await _create(conn, rng, tenant, 31, priority=0, at=at, key=KeyClaim("parked:0", 1)))
                await conn.execute(text("UPDATE runs SET concurrency_held_at = now() WHERE run_id = :r"),
                                   {"r": queued[-1].snapshot.run_id})
                blocker = await _create(conn, rng, tenant, 32, priority=0, at=at, key=KeyClaim("held:0", 1))
                await conn.execute(text("UPDATE runs SET concurrency_held_at = now() WHERE run_id = :r"),
                                   {"r": blocker.snapshot.run_id})
                await runs.append(conn, blocker, [_event("paused", blocker, at)])
            others = ["paused"] if first else rng.sample(("paused", "timed_out", "finishing"), rng.randint(0, 3))
            rest = []
            for n, kind in enumerate(others):
                top = max([q.snapshot.priority for q in queued], default=0) + 2
                stored = await _create(conn, rng, tenant, 40 + n, priority=top if kind == "paused" else 1, at=at)
                rest.append(stored)
                if kind == "finishing":  # a queued run timing out (schedule-to-start): it frees no slot
                    finishing.insert(rng.randrange(len(finishing) + 1), stored.snapshot.run_id)
                else:
                    await runs.append(conn, stored, [_event(kind, stored, at)])
                if kind == "paused" and first:
                    ages[stored.snapshot.run_id] = 72  # the oldest: it would be the best if it were queued
            if not first:
                rng.shuffle(finishing)
            spare = rng.sample(range(1, 72), 71)
            for stored in [*admitted, *queued, *rest]:
                ages.setdefault(stored.snapshot.run_id, spare.pop())
            cases.append(Case(tenant, slots, finishing))
        # Distinct ages, whole seconds: the queue's order by score, then age, has no near ties.
        await diff.set_ages(conn, ages)
    return cases, fences


async def _tenant_limits(engine: AsyncEngine, rng: random.Random,
                         slots: dict[str, int]) -> tuple[dict[str, int], set[str]]:
    """Some tenants' slots stored as limits of their own, their handovers carrying a platform number
    that differs (fewer or more); one tenant's budget spent for the period now running. The slots each
    tenant's handovers carry, and the spent tenants."""
    # Not the first tenant: its runs are the cases each mutant must show in (a spent budget hides them).
    others = [t for t in slots if t != next(iter(slots))]
    own = rng.sample(sorted(others), 3)
    spent = set(rng.sample(sorted(others), 1))
    async with engine.begin() as conn:
        for tenant in own:
            await conn.execute(text("INSERT INTO tenant_limits (tenant_id, version, run_slots, updated_by) "
                                    "VALUES (:t, 1, :n, 'tests')"), {"t": tenant, "n": slots[tenant]})
        for tenant in spent:
            await conn.execute(text(
                "INSERT INTO tenant_budget_use (tenant_id, period_start, period_end, tokens, cost, spent) "
                "VALUES (:t, now() - interval '1 hour', now() + interval '1 hour', 0, 10, true)"), {"t": tenant})
    return {t: rng.choice((0, 100)) if t in own else n for t, n in slots.items()}, spent


def _batch_kind(rng: random.Random, stored: StoredRun, *, order: int | None) -> str:
    """How an admitted run leaves its slot in the batch (finishes, or parks), or, not admitted, times out
    in the queue. The first tenant's runs (``order``: their place in its batch) do both every seed: its
    first finishes, giving its concurrency key back, and its second parks on a rate limit, keeping it."""
    if not stored.admitted:
        return "timed_out"
    if order is not None and order < 2:
        return (_FINISHES[0], "rate_limit")[order]
    return rng.choice(_FINISHES + _PARKS)


def _interleaved(rng: random.Random, cases: list[Case]) -> list[str]:
    """Every tenant's finishing runs in its own order, tenants interleaved at random."""
    pending = [list(c.finishing) for c in cases if c.finishing]
    order = []
    while pending:
        lane = rng.choice(pending)
        order.append(lane.pop(0))
        if not lane:
            pending.remove(lane)
    return order


async def handover_mismatches(engine: AsyncEngine, *, seed: int,
                              mutate: Callable[[], None] | None = None) -> list[str]:
    """Seeded random tenants whose runs finish in one transaction with their handovers; what PostgreSQL
    stored that the domain's model would not have. ``mutate``: applied once the cases are stored."""
    rng = random.Random(seed)
    cases, fences = await _make_cases(engine, rng)
    slots = {c.tenant: c.slots for c in cases}
    carried, spent = await _tenant_limits(engine, rng, slots)
    order = _interleaved(rng, cases)
    async with engine.connect() as conn:
        ids = list((await conn.execute(text("SELECT run_id FROM runs ORDER BY run_id"))).scalars())
        before = await run_batches.load_many(conn, ids)
    if mutate is not None:
        mutate()
    at = time.time()
    planned: dict[str, runs.Planned] = {}
    # The SQL path: every finishing write with its handover, one transaction.
    async with engine.begin() as conn:
        now = (await conn.execute(text("SELECT now()"))).scalar_one()
        mark = await diff.outbox_mark(conn)
        model = {r.run_id: diff.Row(r.tenant_id, RunStatus(r.status), r.admitted, r.priority, r.created_at, r.revision,
                               r.partition, r.concurrency_key, r.concurrency_limit or 0, r.key_held)
                 for r in await conn.execute(text(
                     "SELECT run_id, tenant_id, status, admitted_at IS NOT NULL AS admitted, priority, created_at, "
                     "revision, partition, concurrency_key, concurrency_limit, "
                     "concurrency_held_at IS NOT NULL AS key_held FROM runs"))}
        for n, run_id in enumerate(order):
            stored, fence = before[run_id], fences.get(run_id)
            first = cases[0].finishing
            kind = _batch_kind(rng, stored, order=first.index(run_id) if run_id in first else None)
            planned[run_id] = plan(stored, [_event(kind, stored, at)], release_lease=fence is not None)
            rides = effects.broadcast_rides(stored.snapshot, planned[run_id].after, producer=PRODUCER,
                                            cause=f"step-{n}", handover=effects.SlotHandover(
                                                carried[stored.snapshot.tenant_id], AGING, PARTITIONS))
            await runs.write(conn, planned[run_id], fence=fence, rides=rides)
    # The domain's path: the same transitions, each handing its slot on in the model.
    expected_runs = dict(before)
    expected_events: dict[str, list[dict[str, Any]]] = {r: [] for r in before}
    expected_messages: dict[str, list[Any]] = {}
    handed: set[str] = set()
    for n, run_id in enumerate(order):
        stored, after = before[run_id], planned[run_id].after
        tenant = stored.snapshot.tenant_id
        # The statement's snapshot: the finishing run still counts; later writes see earlier ones.
        held = sum(1 for row in model.values() if row.tenant == tenant and diff.holds_slot(row))
        queue = sorted((row.created_at, r) for r, row in model.items() if row.tenant == tenant and diff.queued(row))
        # A queued run handed a slot earlier in the batch finishes admitted, and hands its slot on.
        admitted = model[run_id].admitted
        parked = diff.parks_without_slot(stored, after)
        model[run_id] = replace(model[run_id], status=after.snapshot.status, revision=after.snapshot.revision,
                                admitted=admitted and not parked)
        expected_runs[run_id] = replace(after, admitted=model[run_id].admitted)
        token = None if run_id not in fences else fences[run_id].token
        expected_events[run_id] = [diff.event_row(run_id, e, a, token) for e, a in planned[run_id].rows]
        broadcast = effects.broadcast_message(stored.snapshot, after, producer=PRODUCER, cause=f"step-{n}")
        expected_messages[run_id] = expected_messages.get(run_id, []) + ([broadcast] if broadcast is not None else [])
        finished = after.snapshot.status in domain_run.TERMINAL
        if not ((finished or parked) and admitted and queue and held <= slots[tenant]) or tenant in spent:
            continue
        # A run waiting for its key is passed over; the best is admitted only if it has no key, holds
        # it, or takes the one the finishing run gave back.
        free = [r for _, r in queue if diff.key_free(model, model[r])]
        if not free:
            continue
        best = min(free, key=lambda r: (-diff.score(model[r], now, AGING), model[r].created_at))
        given_back = model[run_id].key if finished and model[run_id].key_held else None  # a parked run keeps it
        if model[best].key is not None and not model[best].key_held and model[best].key != given_back:
            continue
        model[best] = replace(model[best], admitted=True, key_held=model[best].key is not None)
        expected_runs[best] = replace(expected_runs[best], admitted=True)
        handed.add(best)
        row = model[best]
        expected_messages[best] = [effects.wake_message_of(tenant_id=tenant, run_id=best, revision=row.revision,
                                                           partition=row.partition, reason="admitted",
                                                           producer=PRODUCER, cause=f"slot:{run_id}")]
    found: list[str] = []
    async with engine.connect() as conn:
        stored_rows = await diff.stored_runs(conn, before)
        events = await diff.stored_events(conn, {r: s.stored_seq for r, s in before.items()})
        sent = await diff.stored_messages(conn, mark)
    found += [f"run {run_id}: admitted_at {row['admitted_at']} is not the finishing statement's {now}"
              for run_id, row in sorted(stored_rows.items()) if run_id in handed and row["admitted_at"] != now]
    async with engine.connect() as conn:
        keys_held = dict((await conn.execute(text(
            "SELECT run_id, concurrency_held_at IS NOT NULL FROM runs WHERE concurrency_key IS NOT NULL"))).all())
    found += [f"run {run_id}: holds its concurrency key {keys_held.get(run_id)}, the domain {row.key_held}"
              for run_id, row in sorted(model.items()) if row.key is not None and keys_held.get(run_id) != row.key_held]
    return found + diff.compare_stored(expected_runs, expected_events, expected_messages, stored_rows, events, sent)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_handover_stores_what_the_domain_makes_of_every_finishing_run(clean, engine, seed) -> None:
    started = time.monotonic()
    assert await handover_mismatches(engine, seed=seed) == []
    assert time.monotonic() - started < 20


@contextmanager
def _statements_rebuilt() -> Iterator[None]:
    """The transition statements built again from what the mutant changed, and again after it."""
    runs._compile.cache_clear()
    try:
        yield
    finally:
        runs._compile.cache_clear()


def _timed_out_holds_a_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(domain_run, "TERMINAL", domain_run.TERMINAL - {_S.TIMED_OUT})


def _sql_counts_timed_out_as_holding(monkeypatch: pytest.MonkeyPatch) -> None:
    retyped = sql_names(sorted(domain_run.TERMINAL - {_S.TIMED_OUT}))
    monkeypatch.setattr(admission, "ADMITTED_OPEN",
                        f"tenant_id = {{tenant}} AND admitted_at IS NOT NULL AND status NOT IN ({retyped})")


def _sql_queue_takes_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "QUEUED",
                        f"admitted_at IS NULL AND status IN ({sql_names((_S.READY, _S.PAUSED))})")


def _wakeup_correlated_by_run(monkeypatch: pytest.MonkeyPatch) -> None:
    real = effects.wake_message_of

    @functools.wraps(real)
    def mutated(**kwargs: Any) -> Any:
        message = real(**kwargs)
        return replace(message, envelope=message.envelope.model_copy(update={"correlation_id": kwargs["run_id"]}))
    monkeypatch.setattr(effects, "wake_message_of", mutated)


def _rate_limit_holds_a_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slots, "SLOTLESS_WAITS", slots.SLOTLESS_WAITS - {"rate_limit"})


def _sql_park_keeps_the_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    real = runs._parts

    def mutated() -> dict[str, Any]:
        parts = real()
        return {**parts, "unslot": replace(parts["unslot"], sets="")}
    monkeypatch.setattr(runs, "_parts", mutated)


def _sql_park_frees_by_the_updated_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handover, "PARKED_FREES", handover.FINISHED_FREES)


def _sql_handover_ignores_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "key_free", lambda run, ended_key=None: "TRUE")


def _sql_handover_takes_any_free_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys, "hands_on", lambda run: "TRUE")


MUTANTS: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], str]] = {
    # The domain's slotless waits without the rate limit's: a run parked on one keeps its slot.
    "domain-slotless-waits-without-rate-limit": (_rate_limit_holds_a_slot, "admitted: sql True != domain False"),
    # The parking statement leaves admitted_at set: the parked run still holds its slot.
    "sql-park-keeps-admitted": (_sql_park_keeps_the_slot, "admitted: sql True != domain False"),
    # The parking statement asks the updated row whether the run held a slot: it hands nothing on.
    "sql-park-frees-by-the-updated-row": (_sql_park_frees_by_the_updated_row, "admitted: sql False != domain True"),
    # The domain's status set: TIMED_OUT no longer finishes a run; the SQL still counts it as finished.
    "domain-terminal-set-without-timed-out": (_timed_out_holds_a_slot, "admitted: sql True != domain False"),
    # The status set the SQL is rendered from, retyped without TIMED_OUT: such runs hold their slot.
    "sql-terminal-set-without-timed-out": (_sql_counts_timed_out_as_holding, "admitted: sql False != domain True"),
    # The queue's status set the SQL is rendered from, retyped with PAUSED.
    "sql-queued-set-with-paused": (_sql_queue_takes_paused, "admitted: sql True != domain False"),
    # The handover no longer passes over a run whose concurrency key its holders fill.
    "sql-handover-ignores-concurrency-keys": (_sql_handover_ignores_keys, "admitted: sql True != domain False"),
    # The handover takes a key no finishing run gave back, which admission may be taking meanwhile.
    "sql-handover-takes-any-free-key": (_sql_handover_takes_any_free_key, "admitted: sql True != domain False"),
    # An envelope field the wakeup builder sets per run, which the handover's kept wake does not carry.
    "envelope-wakeup-correlation-per-run": (_wakeup_correlated_by_run, "run.wakeup: payload.correlation_id"),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
async def test_a_mutant_of_the_domain_or_the_handover_is_caught(clean, engine, monkeypatch, mutant) -> None:
    mutate, symptom = MUTANTS[mutant]
    try:
        with _statements_rebuilt():
            mismatches = await handover_mismatches(engine, seed=1, mutate=lambda: mutate(monkeypatch))
            monkeypatch.undo()
    finally:
        monkeypatch.undo()
        await diff.wipe(engine)
    assert mismatches, f"mutant {mutant} survived"
    assert any(symptom in m for m in mismatches), "\n".join(mismatches[:20])
