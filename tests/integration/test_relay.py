"""Outbox relay: at-least-once publishing that consumers turn into exactly-once effects."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import text

from longrun.bus.wakeup import KEPT as WAKE_KEPT
from longrun.db import outbox
from longrun.envelope import decode, make
from longrun.errors import BusUnavailable
from longrun.relay import Relay
from tests.fixtures import eventually
from tests.integration.bus_helpers import applied, create_probe_table, enqueue, route, scalar, wakeup

pytestmark = pytest.mark.integration


@pytest.mark.long
async def test_relay_killed_between_publish_and_mark_publishes_twice_and_consumers_apply_once(
        clean, engine, services) -> None:
    # Given 20 committed outbox rows of one run (one partition, one relay batch) and a consumer
    await create_probe_table(engine)
    async with engine.begin() as conn:
        for i in range(20):
            await enqueue(conn, wakeup("run-crash", f"w-{i}"))
    consumer = services.start("consumer", "tests.probe_consumer")
    # When the relay is SIGKILLed after the broker confirmed and before it marked the rows
    crashing = services.start("relay", "longrun.services.outbox_relay",
                              LONGRUN_CRASH_POINTS="relay.after_publish_before_mark")
    crashing.popen.wait(timeout=60)
    assert crashing.popen.returncode == -9, crashing.output()
    assert await scalar(engine, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == 20
    await eventually(lambda: _applied_count(engine, 20), what="first copies applied")
    # and a new relay takes over
    services.start("relay", "longrun.services.outbox_relay")
    await eventually(lambda: _unpublished_is(engine, 0), what="rows marked published")
    # Then every message went out twice, and every one was applied exactly once
    await eventually(lambda: _duplicates_logged(consumer, 20), what="20 duplicates dropped",
                     timeout=30)
    rows = await applied(engine)
    assert sorted(w for _, w, _ in rows) == sorted(f"w-{i}" for i in range(20))
    assert await scalar(engine, "SELECT count(*) FROM inbox_worker") == 20


async def test_relay_publishes_a_row_that_commits_late(clean, engine, services) -> None:
    # Given a transaction that takes an outbox id first and commits last
    await create_probe_table(engine)
    services.start("consumer", "tests.probe_consumer")
    services.start("relay", "longrun.services.outbox_relay")
    late = await engine.connect()
    transaction = await late.begin()
    await enqueue(late, wakeup("run-late", "w-late"))
    async with engine.begin() as conn:
        await enqueue(conn, wakeup("run-early", "w-early"))
    await eventually(lambda: _applied_count(engine, 1), what="the early row applied")
    # When the older row finally commits
    await transaction.commit()
    await late.close()
    # Then the relay still publishes it: there is no high-water mark to skip it
    await eventually(lambda: _applied_count(engine, 2), what="the late row applied")
    assert {w for _, w, _ in await applied(engine)} == {"w-early", "w-late"}


async def test_a_row_behind_its_runs_eager_row_waits_for_it_and_another_runs_row_does_not(
        clean, engine, services) -> None:
    # Given, in one partition, a run's row its writer publishes itself (eager, within its grace), that
    # run's next row, and another run's row, all committed
    await create_probe_table(engine)
    eager_run = "run-eager"
    other = next(f"run-other-{i}" for i in range(1000) if route(f"run-other-{i}")[2] == route(eager_run)[2])
    async with engine.begin() as conn:
        await enqueue(conn, wakeup(eager_run, "w-eager"))
        await conn.execute(text("UPDATE outbox SET eager_until = now() + interval '1 hour'"))
        await enqueue(conn, wakeup(eager_run, "w-behind"))
        await enqueue(conn, wakeup(other, "w-other"))
    services.start("consumer", "tests.probe_consumer")
    services.start("relay", "longrun.services.outbox_relay")
    # When the relay drains the partition
    await eventually(lambda: _applied_count(engine, 1), what="the other run's row applied")
    # Then it published the other run's row, though written last, and not the two of the eager run: the
    # row behind the eager one would have gone first (id order) had it been free
    assert [w for _, w, _ in await applied(engine)] == ["w-other"]
    # When the writer marks its row sent, as the eager publisher does (NOTIFY included)
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE outbox SET published_at = now() WHERE eager_until IS NOT NULL"))
        await conn.execute(text(f"SELECT pg_notify('{outbox.NOTIFY_CHANNEL}', '')"))
    # Then the row behind it goes out
    await eventually(lambda: _applied_count(engine, 2), what="the row behind applied")
    assert [w for _, w, _ in await applied(engine)] == ["w-other", "w-behind"]


class _FailingBus:
    """Confirms every publish except those of the wakeups (by reason) it is told to fail; keeps their bodies."""

    def __init__(self, failing: set[str]) -> None:
        self.failing = failing
        self.published: list[str] = []
        self.bodies: list[dict[str, Any]] = []

    async def ensure_connected(self) -> None:
        pass

    async def publish_many(self, items: Sequence[tuple[str, str, Any]]) -> list[BaseException | None]:
        results: list[BaseException | None] = []
        for _, _, message in items:
            body = json.loads(message.body)
            wakeup_id = body["payload"]["reason"]
            self.published.append(wakeup_id)
            self.bodies.append(body)
            results.append(BusUnavailable("refused") if wakeup_id in self.failing else None)
        return results


async def test_one_read_serves_every_owned_partition_and_a_failed_publish_holds_back_its_partition(
        clean, engine, statements, monkeypatch) -> None:
    # Given unpublished rows in partitions 1, 2 and 5, of which the relay owns 1 and 2
    async with engine.begin() as conn:
        for partition, wakeup_id in ((1, "p1-a"), (2, "p2-a"), (1, "p1-b"), (5, "p5-a"), (2, "p2-b")):
            envelope = make("run.wakeup", {"wakeup_id": wakeup_id, "reason": wakeup_id}, producer="tests",
                            tenant_id="tenant-a", run_id=f"run-{wakeup_id}")
            await outbox.enqueue(conn, envelope, exchange="x", routing_key="k", partition=partition)
    bus = _FailingBus(failing={"p1-a"})
    relay = Relay(statements, bus, batch=50, poll_interval=1.0)  # type: ignore[arg-type]
    await relay.acquire({1, 2})
    reads: list[list[int]] = []
    unpublished = outbox.unpublished

    async def counted(*args: Any, **kwargs: Any) -> list[outbox.OutboxRow]:
        rows = await unpublished(*args, **kwargs)
        reads.append([row.partition for row in rows])
        return rows

    monkeypatch.setattr(outbox, "unpublished", counted)
    # When a round drains while the broker refuses partition 1's first row
    await relay.drain()
    # Then one read fetched both owned partitions in id order, and partition 5 was left alone
    assert reads == [[1, 2, 1, 2]]
    assert bus.published == ["p1-a", "p2-a", "p1-b", "p2-b"]
    # and partition 2 was marked, while partition 1 keeps its failed row and the row behind it,
    # to be published again in their order
    async with engine.connect() as conn:
        left = await conn.execute(text("SELECT type, payload FROM outbox WHERE published_at IS NULL ORDER BY id"))
        assert [outbox.envelope_of(r.type, r.payload)["payload"]["reason"] for r in left] == ["p1-a", "p1-b", "p5-a"]
    bus.failing.clear()
    await relay.drain()
    assert bus.published[4:] == ["p1-a", "p1-b"]


async def test_a_busy_relay_sends_one_statement_per_round_marking_with_the_next_read(
        clean, engine, statements, monkeypatch) -> None:
    # Given five unpublished rows of an owned partition, and a relay reading two at a time
    async with engine.begin() as conn:
        for wakeup_id in ("a", "b", "c", "d", "e"):
            envelope = make("run.wakeup", {"wakeup_id": wakeup_id, "reason": wakeup_id}, producer="tests",
                            tenant_id="tenant-a", run_id=f"run-{wakeup_id}")
            await outbox.enqueue(conn, envelope, exchange="x", routing_key="k", partition=1)
    bus = _FailingBus(failing=set())
    relay = Relay(statements, bus, batch=2, poll_interval=1.0)  # type: ignore[arg-type]
    await relay.acquire({1})
    statements_sent: list[tuple[int, int]] = []
    unpublished, mark_published = outbox.unpublished, outbox.mark_published

    async def read(*args: Any, marked: Sequence[int] = (), **options: Any) -> list[outbox.OutboxRow]:
        rows = await unpublished(*args, marked=marked, **options)
        statements_sent.append((len(marked), len(rows)))
        return rows

    async def mark(*args: Any) -> None:
        statements_sent.append((-1, -1))
        await mark_published(*args)

    monkeypatch.setattr(outbox, "unpublished", read)
    monkeypatch.setattr(outbox, "mark_published", mark)
    # When it drains them
    await relay.drain()
    # Then each round's statement marked what the round before it got confirmed, and read the next
    assert statements_sent == [(0, 2), (2, 2), (2, 1), (1, 0)]
    assert bus.published == ["a", "b", "c", "d", "e"] and relay.published == 5
    assert await _unpublished_is(engine, 0)


async def _applied_count(engine, n: int) -> bool:  # type: ignore[no-untyped-def]
    return await scalar(engine, "SELECT count(*) FROM probe_handled") >= n


async def _unpublished_is(engine, n: int) -> bool:  # type: ignore[no-untyped-def]
    return await scalar(engine, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == n


async def _duplicates_logged(process, n: int) -> bool:  # type: ignore[no-untyped-def]
    return process.output().count("dropped on longrun.worker") >= n


async def test_the_outbox_keeps_a_wakeup_as_its_wake_and_any_other_message_whole(clean, engine) -> None:
    # Given a run's wakeup carrying a trace, and a rejection that names no run
    traced = make("run.wakeup", {"wakeup_id": "w-1", "reason": "probe"}, producer="tests", tenant_id="tenant-a",
                  run_id="run-row", trace="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                  expected_state_version=3, causation_id="cause-1", event_id="w-1")
    rejected = make("run.rejected", {"code": "idempotency_key_reused", "idempotency_key": "k",
                                     "reason": "input differs", "existing_run_id": "run-x"},
                    producer="tests", tenant_id="tenant-a")
    messages = [outbox.Message(traced, "work", "p.1", 1), outbox.Message(rejected, "events", "run.rejected", 0)]
    # When both are enqueued together
    async with engine.begin() as conn:
        await outbox.enqueue_many(conn, messages)
    # Then each row is routed as its message, the wakeup kept as its wake, the rejection whole
    async with engine.connect() as conn:
        stored = [dict(r._mapping) for r in await conn.execute(
            text(f"SELECT {', '.join(outbox.COLUMNS)} FROM outbox ORDER BY id"))]
    assert [(r["event_id"], r["aggregate_type"], r["aggregate_id"], r["partition"], r["exchange"], r["routing_key"],
             r["type"], r["traceparent"]) for r in stored] == [
        ("w-1", "run", "run-row", 1, "work", "p.1", "run.wakeup", traced.trace),
        (rejected.event_id, "run", rejected.event_id, 0, "events", "run.rejected", "run.rejected", None)]
    assert set(stored[0]["payload"]) == set(WAKE_KEPT)
    assert stored[1]["payload"] == rejected.model_dump(mode="json")
    # and what the relay publishes for each is its message
    assert [decode(json.dumps(outbox.envelope_of(r["type"], r["payload"])).encode()) for r in stored] == [
        traced, rejected]


async def test_a_wakeup_written_whole_before_the_upgrade_is_published_as_written(clean, engine, statements) -> None:
    # Given a wakeup row as writers wrote them before wakeups were kept as data: the whole envelope
    old = make("run.wakeup", {"wakeup_id": "w-old", "reason": "before the upgrade"}, producer="scheduler",
               tenant_id="tenant-a", run_id="run-old", expected_state_version=2, causation_id="cause-old")
    async with engine.begin() as conn:
        await conn.execute(text(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, partition, exchange, routing_key, type, "
            "payload) VALUES (:e, 'run', 'run-old', 1, 'x', 'k', 'run.wakeup', CAST(:p AS json))"),
            {"e": old.event_id, "p": old.model_dump_json()})
    bus = _FailingBus(failing=set())
    relay = Relay(statements, bus, batch=10, poll_interval=1.0)  # type: ignore[arg-type]
    await relay.acquire({1})
    # When the relay drains it
    await relay.drain()
    # Then it went out as it was written, and is marked published
    assert bus.published == ["before the upgrade"] and bus.bodies == [old.model_dump(mode="json")]
    assert await _unpublished_is(engine, 0)
