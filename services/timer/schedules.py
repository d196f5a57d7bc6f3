"""The timer service's firing of schedules (``app.timer.schedules``): one transaction per due schedule,
claimed with ``FOR UPDATE SKIP LOCKED`` (replicas share them; one being fired is left to its replica),
whose runs are created, due times recorded and next due time moved on together."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun import faults
from longrun.app.timer.schedules import Admission, fire
from longrun.db import schedules
from longrun.db.schedules import PgScheduleRecords
from longrun.db.errors import is_transient
from longrun.db.transaction import PgTransaction

logger = logging.getLogger(__name__)


async def fire_due(engine: AsyncEngine, admission: Admission, *, clock: Callable[[], float] = time.time) -> int:
    """Fire the schedules due now, one transaction each; returns how many were fired. A schedule that
    fails for a reason other than the database's (its stored run unreadable by this build) is rolled
    back, logged and left for the next round, so it holds back no other."""
    fired = 0
    failing: list[str] = []
    while True:
        claimed_id = None
        try:
            async with engine.begin() as conn:
                claimed = await schedules.claim_due(conn, failing)
                if claimed is None:
                    return fired
                claimed_id = claimed.schedule.schedule_id
                next_due = await fire(PgTransaction(conn), PgScheduleRecords(conn), claimed.schedule, claimed.now,
                                      admission, clock=clock)
                faults.crash_point("timer.schedule_fired_before_commit")
                await schedules.advance(conn, claimed_id, next_due)
        except Exception as e:
            if claimed_id is None or is_transient(e):
                raise
            logger.exception("schedule %s failed to fire; left for the next round", claimed_id)
            failing.append(claimed_id)
            continue
        fired += 1
