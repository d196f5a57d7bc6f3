"""Each run's stored history folds into its stored snapshot: checked after every test of the tiers
over the real services (tests/integration, tests/security), each importing the fixture into its
conftest. An archived run's history is in its archive: tests/integration/test_retention.py folds it
from there."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text

from longrun.db import runs
from longrun.db.engine import make_engine
from longrun.domain import fold
from tests.infra import Infra


@pytest.fixture(autouse=True)
async def snapshots_are_projections_of_their_events(infra: Infra) -> AsyncIterator[None]:
    yield
    engine = make_engine(infra.database_url, pool_size=1)
    try:
        async with engine.connect() as conn:
            run_ids = (await conn.execute(text(
                "SELECT run_id FROM runs WHERE archived_at IS NULL ORDER BY run_id"))).scalars().all()
            for run_id in run_ids:
                stored = await runs.load(conn, run_id)
                assert stored is not None
                assert fold(await runs.history(conn, run_id)) == stored.snapshot, f"{run_id} drifted from its events"
    finally:
        await engine.dispose()
