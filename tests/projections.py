"""Each run's stored history folds into its stored snapshot: checked after every test of the tiers
over the real services (tests/integration, tests/security), each importing the fixture into its
conftest. An archived run's history is in its archive: tests/integration/test_retention.py folds it
from there."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import select, text

from longrun.db import run_batches
from longrun.db.engine import make_engine
from longrun.db.schema import run_events
from longrun.domain import events as ev
from longrun.domain import fold
from tests.infra import Infra

PAGE = 1000
"""Runs checked per pair of queries: a load test's thousands of runs take seconds, not one round trip each."""


@pytest.fixture(autouse=True)
async def snapshots_are_projections_of_their_events(infra: Infra) -> AsyncIterator[None]:
    yield
    engine = make_engine(infra.database_url, pool_size=1)
    try:
        async with engine.connect() as conn:
            run_ids = (await conn.execute(text(
                "SELECT run_id FROM runs WHERE archived_at IS NULL ORDER BY run_id"))).scalars().all()
            for start in range(0, len(run_ids), PAGE):
                page = run_ids[start:start + PAGE]
                stored = await run_batches.load_many(conn, page)
                histories: dict[str, list[ev.RunEvent]] = defaultdict(list)
                for row in await conn.execute(select(run_events.c.run_id, run_events.c.data)
                                              .where(run_events.c.run_id.in_(page))
                                              .order_by(run_events.c.run_id, run_events.c.seq)):
                    histories[row.run_id].append(ev.event_from_dict(row.data))
                for run_id in page:
                    assert fold(histories[run_id]) == stored[run_id].snapshot, f"{run_id} drifted from its events"
    finally:
        await engine.dispose()
