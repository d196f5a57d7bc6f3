"""What a run's JSONB columns accept: a value PostgreSQL cannot hold is refused, never changed."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest
from sqlalchemy import text

from longrun.db import runs
from longrun.domain import PinnedVersions, Usage, freeze
from longrun.domain import events as ev

pytestmark = pytest.mark.integration


async def test_a_goal_holding_nan_is_refused_with_an_error_and_nothing_is_stored(clean, engine) -> None:
    # Given a run whose goal carries NaN (pydantic lets it through from a run.create's JSON)
    run_id = f"run-{uuid.uuid4()}"
    created = ev.RunCreated(seq=1, at=time.time(), run_id=run_id, tenant_id="acme", kind="probe",
                            goal=freeze({"threshold": float("nan")}),
                            versions=PinnedVersions(workflow="1", prompt="none", model_policy="none",
                                                    tool_schemas="v1"),
                            budget=Usage(model_calls=1, tool_calls=1, cost=1.0))
    # When it is created, Then PostgreSQL refuses it (the inbox consumer retries, then quarantines)
    with pytest.raises(psycopg.DataError, match="json"):
        async with engine.begin() as conn:
            await runs.create(conn, created, idempotency_key=run_id, input_hash="h" * 64, partition=0)
    # and no run was stored with the NaN silently turned into something else
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM runs WHERE run_id = :r"), {"r": run_id})).scalar() == 0
