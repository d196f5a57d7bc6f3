"""Outbox relay: at-least-once publishing that consumers turn into exactly-once effects."""

from __future__ import annotations

import pytest

from tests.fixtures import eventually
from tests.integration.bus_helpers import applied, create_probe_table, enqueue, scalar, wakeup

pytestmark = pytest.mark.integration


async def test_relay_killed_between_publish_and_mark_publishes_twice_and_consumers_apply_once(
        clean, engine, services) -> None:
    # Given 20 committed outbox rows of one run (one partition, one relay batch) and a consumer
    await create_probe_table(engine)
    async with engine.begin() as conn:
        for i in range(20):
            await enqueue(conn, wakeup("run-crash", f"w-{i}"))
    consumer = services.start("consumer", "tests.probe_consumer")
    # When the relay is SIGKILLed after the broker confirmed and before it marked the rows
    crashing = services.start("relay", "services.outbox_relay",
                              LONGRUN_CRASH_POINTS="relay.after_publish_before_mark")
    crashing.popen.wait(timeout=60)
    assert crashing.popen.returncode == -9, crashing.output()
    assert await scalar(engine, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == 20
    await eventually(lambda: _applied_count(engine, 20), what="first copies applied")
    # and a new relay takes over
    services.start("relay", "services.outbox_relay")
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
    services.start("relay", "services.outbox_relay")
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


async def _applied_count(engine, n: int) -> bool:  # type: ignore[no-untyped-def]
    return await scalar(engine, "SELECT count(*) FROM probe_handled") >= n


async def _unpublished_is(engine, n: int) -> bool:  # type: ignore[no-untyped-def]
    return await scalar(engine, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == n


async def _duplicates_logged(process, n: int) -> bool:  # type: ignore[no-untyped-def]
    return process.output().count("dropped on longrun.worker") >= n
