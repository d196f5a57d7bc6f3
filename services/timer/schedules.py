"""The timer service's firing of schedules (``app.timer.schedules``): one transaction per due schedule,
claimed with ``FOR UPDATE SKIP LOCKED`` (replicas share them; one being fired is left to its replica),
whose runs are created, due times recorded and next due time moved on together."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun import faults
from longrun.app.timer.schedules import Admission, fire
from longrun.db import schedules
from longrun.db.schedules import PgScheduleRecords
from longrun.db.transaction import PgTransaction


async def fire_due(engine: AsyncEngine, admission: Admission, *, clock: Callable[[], float] = time.time) -> int:
    """Fire the schedules due now, one transaction each; returns how many were fired."""
    fired = 0
    while True:
        async with engine.begin() as conn:
            claimed = await schedules.claim_due(conn)
            if claimed is None:
                return fired
            next_due = await fire(PgTransaction(conn), PgScheduleRecords(conn), claimed.schedule, claimed.now,
                                  admission, clock=clock)
            faults.crash_point("timer.schedule_fired_before_commit")
            await schedules.advance(conn, claimed.schedule.schedule_id, next_due)
        fired += 1
