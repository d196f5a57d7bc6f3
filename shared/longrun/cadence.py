"""When a schedule's runs are due (``domain.schedules``): a cron expression (five fields, read in UTC)
or an interval in seconds, from an anchor; each due time's idempotency key; a backfill's due times."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from croniter import croniter

from longrun.domain.schedules import Overlap

SHORTEST_INTERVAL = 0.5
"""Seconds; the timer service looks for due schedules twice a second."""
LONGEST_INTERVAL = 366 * 86400.0
BACKFILL_MOST = 5000
"""Due times one backfill may create runs for (a past hour of a two-second schedule holds 1800)."""
_TICK = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Cadence:
    """Either a cron expression or an interval in seconds: due at ``anchor`` plus any whole number of
    intervals. A schedule's first due time is its anchor, or the first cron match after it."""

    anchor: datetime
    cron: str | None = None
    every: float | None = None

    def after(self, moment: datetime) -> datetime:
        """The first due time strictly after ``moment``."""
        if self.every is not None:
            step = timedelta(seconds=self.every)
            return self.anchor + (math.floor((moment - self.anchor) / step) + 1) * step
        assert self.cron is not None
        found: datetime = croniter(self.cron, moment.astimezone(UTC)).get_next(datetime)
        return found

    def last_before(self, start: datetime, bound: datetime) -> datetime:
        """The last due time at or after ``start`` and before ``bound``, found without walking those
        between (a timer service down for a week, a schedule every second)."""
        if self.every is not None:
            step = timedelta(seconds=self.every)
            last = self.anchor + math.floor((bound - self.anchor) / step) * step
            return max(start, last if last < bound else last - step)
        assert self.cron is not None
        found: datetime = croniter(self.cron, bound.astimezone(UTC)).get_prev(datetime)
        return max(start, found.replace(fold=0))

    def first(self) -> datetime:
        return self.anchor if self.every is not None else self.after(self.anchor)

    def next_from(self, now: datetime) -> datetime:
        """The first due time at or after ``now``, and not before the first."""
        return max(self.first(), self.after(now - _TICK))


def cadence_problem(cron: str | None, every: float | None) -> str | None:
    """Why ``cron``/``every`` is no cadence; None when it is one."""
    if (cron is None) == (every is None):
        return "a schedule has either a cron expression or an interval (every), not both nor neither"
    if every is not None:
        if not SHORTEST_INTERVAL <= every <= LONGEST_INTERVAL:
            return f"every is {SHORTEST_INTERVAL} to {LONGEST_INTERVAL:.0f} seconds, got {every}"
        return None
    assert cron is not None
    if len(cron.split()) != 5:
        return f"cron has five fields (minute hour day-of-month month day-of-week), got {cron!r}"
    if not croniter.is_valid(cron):
        return f"cron expression {cron!r} is not valid"
    return None


def idempotency_key(schedule_id: str, due: datetime) -> str:
    """The key of the run made for ``due``: the same for every firing of that time, backfills included."""
    return f"schedule:{schedule_id}:{due.astimezone(UTC).isoformat(timespec='milliseconds')}"


def backfill_times(cadence: Cadence, start: datetime, end: datetime) -> list[datetime]:
    """The due times in ``[start, end)``; ValueError past ``BACKFILL_MOST`` of them or for an empty range."""
    if end <= start:
        raise ValueError(f"a backfill's end ({end.isoformat()}) must be after its start ({start.isoformat()})")
    times: list[datetime] = []
    moment = cadence.after(start - _TICK)
    while moment < end:
        if len(times) == BACKFILL_MOST:
            raise ValueError(f"a backfill covers at most {BACKFILL_MOST} due times; "
                             f"{start.isoformat()} to {end.isoformat()} holds more")
        times.append(moment)
        moment = cadence.after(moment)
    return times


@dataclass(frozen=True, slots=True)
class Schedule:
    schedule_id: str
    tenant_id: str
    run: dict[str, Any]
    """The run.create payload each due time sends, less its idempotency key."""
    cadence: Cadence
    overlap: Overlap
    catch_up: float
    """Seconds: due times older than this when looked at are missed, not fired."""
    paused: bool
    next_due_at: datetime
    created_by: str
    created_at: datetime

    def window(self, now: datetime) -> datetime:
        """Due times before this are missed at ``now``."""
        return now - timedelta(seconds=self.catch_up)

    def json(self) -> dict[str, Any]:
        return {"schedule_id": self.schedule_id, "tenant_id": self.tenant_id, "workflow": self.run["workflow"],
                "run": self.run, "cron": self.cadence.cron, "every": self.cadence.every,
                "anchor": self.cadence.anchor.isoformat(), "overlap": self.overlap.value,
                "catch_up_window": self.catch_up, "paused": self.paused,
                "next_due_at": self.next_due_at.isoformat(), "created_by": self.created_by,
                "created_at": self.created_at.isoformat()}
