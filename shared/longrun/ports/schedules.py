"""What firing a schedule (``app.timer.schedules``) records, in the transaction that creates its runs."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol


class ScheduleRecords(Protocol):
    async def record(self, schedule_id: str, due: datetime, outcome: str, *, run_id: str | None = None,
                     reason: str | None = None, through: datetime | None = None, backfill: bool = False) -> None:
        """What the due time did (``created``, ``skipped``, ``missed`` through ``through``), once per time:
        a time recorded already keeps its first record."""

    async def now(self) -> datetime:
        """The database's time."""
