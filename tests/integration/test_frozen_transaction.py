"""A process frozen inside a transaction must not hold its locks for everyone: PostgreSQL ends the
session after ``LONGRUN_IDLE_TRANSACTION_TIMEOUT`` seconds, and the locks go with it."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from longrun.bootstrap import open_database
from longrun.config import Settings
from longrun.db.errors import is_transient

pytestmark = pytest.mark.integration


async def test_a_session_idle_inside_a_transaction_is_ended_and_its_locks_freed(infra, engine) -> None:
    # Given a service's engine with a 1 s idle-transaction timeout, holding a lock inside a transaction
    settings = Settings.from_env({"LONGRUN_DATABASE_URL": infra.database_url,
                                  "LONGRUN_IDLE_TRANSACTION_TIMEOUT": "1"})
    frozen_engine = await open_database(settings)
    try:
        async with frozen_engine.connect() as frozen:
            await frozen.execute(text("SELECT pg_advisory_xact_lock(424242)"))
            # When the process stops talking for longer than that (frozen, stuck in a call)
            await asyncio.sleep(2.5)
            # Then another session can take the lock
            async with engine.connect() as other:
                assert (await other.execute(text("SELECT pg_try_advisory_xact_lock(424242)"))).scalar() is True
                await other.rollback()
            # and the frozen session learns its transaction is gone, as a transient error (it retries anew)
            with pytest.raises(Exception) as gone:
                await frozen.execute(text("SELECT 1"))
            assert is_transient(gone.value), repr(gone.value)
    finally:
        await frozen_engine.dispose()


def test_the_timeout_is_thirty_seconds_unless_set() -> None:
    assert Settings.from_env({}).idle_transaction_timeout == 30.0
