"""The database gauges of /metrics: they agree with the tables, one process exports them, and reading
them at 10,000 runs and 10,000 actions costs little (the figure is printed: ``-s`` shows it)."""

from __future__ import annotations

from prometheus_client import REGISTRY
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.db.schema import metadata
from longrun.domain import RunStatus
from longrun.services.reconciler import gauges
from tests.integration import runs_factory

RUNS = 10_000
STATUSES = ("READY", "COMPLETED", "FAILED", "NEEDS_ATTENTION", "CANCELLED")
LIMITS = {RunStatus.READY: 60.0}
COST_BOUND = 1.0
"""Seconds one collection may take at this size on a loaded 2-core CI machine (it takes ~0.02 s)."""


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


async def _many_runs(engine: AsyncEngine) -> None:
    """``RUNS`` copies of one real run, spread over statuses, one action each (every 10th in doubt, ten
    minutes old), 300 unpublished outbox rows and a quarantined message."""
    template = await runs_factory.created(engine)
    async with engine.begin() as conn:
        await conn.execute(text(
            "CREATE TEMP TABLE copies ON COMMIT DROP AS SELECT runs.*, g FROM runs, generate_series(1, :n) g "
            "WHERE run_id = :id"), {"n": RUNS, "id": template.snapshot.run_id})
        await conn.execute(text(
            "UPDATE copies SET run_id = run_id || '-' || g, idempotency_key = idempotency_key || '-' || g, "
            "status = (CAST(:statuses AS text[]))[1 + g % 5], "
            "snapshot = jsonb_set(snapshot, '{status_since}', to_jsonb(extract(epoch FROM now()) - 3600))"),
            {"statuses": list(STATUSES)})
        await conn.execute(text("ALTER TABLE copies DROP COLUMN g"))
        await conn.execute(text("INSERT INTO runs SELECT * FROM copies"))
        await conn.execute(text(
            "INSERT INTO actions (action_id, run_id, logical_action, tool, tool_version, effect_kind, "
            "idempotency_key, request_hash, request, status, fencing_token, updated_at) "
            "SELECT 'a-' || run_id, run_id, 'open_pr', 'forge.open_pr', '1', 'non_idempotent_write', 'k-' || run_id, "
            "'h', '{}', CASE WHEN right(run_id, 1) = '0' THEN 'UNKNOWN' ELSE 'CONFIRMED' END, 1, "
            "now() - interval '10 minutes' FROM copies"))
        await conn.execute(text(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, partition, exchange, routing_key, type, "
            "payload, created_at) SELECT 'e-' || g, 'run', 'r', 0, 'x', 'k', 'run.wakeup', '{}', "
            "now() - interval '2 minutes' FROM generate_series(1, 300) g"))
        await conn.execute(text(
            "INSERT INTO quarantine (owner, queue, error_code, reason, body, headers, attempts, first_failure_at, "
            "last_failure_at) VALUES ('worker', 'q', 'unknown_schema_version', 'v9', '\\x00', '{}', 1, now(), now())"))


async def _truncate(engine: AsyncEngine) -> None:
    names = ", ".join(f'"{t.name}"' for t in reversed(metadata.sorted_tables))
    async with engine.begin() as conn:
        await conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))


async def test_gauges_agree_with_the_database_and_cost_little_at_ten_thousand_runs(
        engine: AsyncEngine, clean: None) -> None:
    try:
        await _many_runs(engine)
        await gauges.collect_once(engine, silence_limits=LIMITS, tenants=False)  # warm (plans, caches)
        took = min([await gauges.collect_once(engine, silence_limits=LIMITS, tenants=False) for _ in range(3)])
        print(f"\ndatabase gauges at {RUNS} runs and {RUNS} actions: {took * 1000:.1f} ms")
        assert took < COST_BOUND
        async with engine.connect() as conn:
            by_status = {s: n for s, n in await conn.execute(text("SELECT status, count(*) FROM runs GROUP BY status"))}
            unknown = (await conn.execute(text("SELECT count(*) FROM actions WHERE status = 'UNKNOWN'"))).scalar()
            backlog = (await conn.execute(text("SELECT count(*) FROM outbox WHERE published_at IS NULL"))).scalar()
        for status, n in by_status.items():
            assert sample("longrun_runs", workflow="dependency_upgrade", status=status, tenant="") == n
        assert sum(by_status.values()) == RUNS + 1
        assert sample("longrun_actions", status="UNKNOWN") == unknown == RUNS // 10
        assert sample("longrun_actions", status="SUBMITTED") == 0
        assert 600 <= sample("longrun_actions_unknown_oldest_age_seconds") < 660  # type: ignore[operator]
        assert sample("longrun_outbox_backlog_messages") == backlog == 300
        assert 120 <= sample("longrun_outbox_oldest_unpublished_age_seconds") < 180  # type: ignore[operator]
        assert sample("longrun_quarantine_messages", owner="worker", reason="unknown_schema_version") == 1
        # READY for an hour with no lease, limit 60 s: every READY copy (the template is fresh).
        assert sample("longrun_runs_silent", status="READY") == by_status["READY"] - 1
        assert sample("longrun_metrics_collector") == 1
    finally:
        gauges.withdraw()
        await _truncate(engine)


async def test_one_process_holds_the_collector_lease_and_the_others_export_nothing(
        engine: AsyncEngine, clean: None) -> None:
    assert await gauges.take_lease(engine, "reconciler-a", 30)
    assert not await gauges.take_lease(engine, "reconciler-b", 30)
    assert await gauges.take_lease(engine, "reconciler-a", 30)  # renewed by its holder
    await gauges.collect_once(engine, silence_limits={}, tenants=False)
    assert sample("longrun_outbox_backlog_messages") == 0
    gauges.withdraw()  # what a replica without the lease exports
    assert sample("longrun_outbox_backlog_messages") is None
    assert sample("longrun_actions", status="UNKNOWN") is None
    assert sample("longrun_metrics_collector") == 0
    # A holder that stops renewing is replaced once the lease runs out.
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE partition_leases SET lease_until = now() - interval '1 second' "
                                "WHERE service = :s"), {"s": gauges.COLLECTOR})
    assert await gauges.take_lease(engine, "reconciler-b", 30)
    assert not await gauges.take_lease(engine, "reconciler-a", 30)


async def test_runs_carry_their_tenant_only_when_the_setting_turns_it_on(engine: AsyncEngine, clean: None) -> None:
    await runs_factory.created(engine, tenant="globex")
    try:
        await gauges.collect_once(engine, silence_limits={}, tenants=True)
        assert sample("longrun_runs", workflow="dependency_upgrade", status="READY", tenant="globex") == 1
        await gauges.collect_once(engine, silence_limits={}, tenants=False)
        assert sample("longrun_runs", workflow="dependency_upgrade", status="READY", tenant="globex") is None
        assert sample("longrun_runs", workflow="dependency_upgrade", status="READY", tenant="") == 1
    finally:
        gauges.withdraw()

