"""The bench's bus row (``bench/terminal_event.py``) on the real ensemble: each lone run is timed from its
publish to its terminal event delivered on a consumer's queue, which comes after PostgreSQL recorded the
run's completion, never before."""

from __future__ import annotations

import statistics

import pytest
from sqlalchemy import text

from bench import terminal_event
from bench.ensemble import TENANT, Producer
from tests.integration.ensemble import Ensemble

pytestmark = pytest.mark.integration

RUNS = 5


@pytest.mark.timeout(180)
async def test_each_lone_run_is_timed_to_its_terminal_event_received_on_the_bus(
        clean, infra, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given the ensemble
    Ensemble(services, tmp_path).start_services("scheduler", "worker", "relay")

    # When the bench's producer runs its lone runs one at a time, waiting for each on the bus
    async with Producer(infra.amqp_url) as producer:
        row = await terminal_event.lone_runs(producer, TENANT, RUNS, 2)

    # Then every run's terminal event arrived, each run completed, and the first (warm-up) is left out
    assert row["terminal_statuses"] == {"completed": RUNS}
    assert row["terminal_event_ms"]["n"] == RUNS - 1
    # and each was timed past its completion's record in PostgreSQL (the relay's hop comes after it)
    async with engine.connect() as conn:
        completed = {r.key: float(r.at) for r in await conn.execute(text(
            "SELECT r.idempotency_key AS key, extract(epoch FROM e.recorded_at) AS at FROM runs r "
            "JOIN run_events e ON e.run_id = r.run_id WHERE r.tenant_id = :t AND e.type = 'run.completed'"),
            {"t": TENANT})}
    in_postgres = sorted((completed[key] - at) * 1000 for key, at in sorted(producer.published.items())[1:])
    assert len(in_postgres) == RUNS - 1
    assert row["terminal_event_ms"]["p50"] >= statistics.median_low(in_postgres)
    assert row["terminal_event_ms"]["max"] >= in_postgres[-1]
