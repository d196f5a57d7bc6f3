"""The schedules table in memory, and the timer service's due path for it under the world's clock: each
due schedule fired by the runtime's own use case (``app.timer.schedules.fire``: runs created through
admission, each due time recorded once, a range older than the catch-up window missed) in one of the
world's transactions, its next due time moved on with it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

from longrun.app.timer.schedules import Admission, Backfilled, backfill, fire
from longrun.cadence import Cadence, Schedule
from longrun.domain.schedules import Overlap


class World(Protocol):
    """What of ``testing.world.World`` the schedules use."""

    clock: Callable[[], float]

    def new_id(self, prefix: str = "id") -> str: ...
    def in_transaction(self, use_case: Any) -> Any: ...
    def admit(self, tenant_id: str) -> None: ...


class MemorySchedules:
    """``schedules`` and ``schedule_fires``, and their firing."""

    def __init__(self, world: World, admission: Admission) -> None:
        self.world = world
        self.admission = admission
        self.rows: dict[str, Schedule] = {}
        self.fires: dict[tuple[str, datetime], dict[str, Any]] = {}
        """(schedule, due time) -> what the time did: ``outcome``, ``run_id``, ``reason``, ``through``, ``backfill``."""

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.world.clock(), UTC)

    def add(self, tenant_id: str, kind: str, goal: dict[str, Any], *, every: float | None = None,
            cron: str | None = None, overlap: Overlap = Overlap.SKIP, catch_up: float = 300.0,
            anchor: datetime | None = None) -> str:
        """A schedule of ``kind`` runs with input ``goal``, as ``POST /schedules`` makes it; its id."""
        now = self._now()
        cadence = Cadence(anchor or now, cron, every)
        schedule_id = self.world.new_id("sched")
        run = {"workflow": kind, "input": dict(goal), "budget": {"model_calls": 5, "tool_calls": 50, "cost_usd": 5.0}}
        self.rows[schedule_id] = Schedule(schedule_id, tenant_id, run, cadence, overlap, catch_up, False,
                                          cadence.next_from(now), "memory", now)
        return schedule_id

    def pause(self, schedule_id: str) -> None:
        self.rows[schedule_id] = replace(self.rows[schedule_id], paused=True)

    def resume(self, schedule_id: str) -> None:
        """Resumed, it goes on from its next due time after now."""
        schedule = self.rows[schedule_id]
        self.rows[schedule_id] = replace(schedule, paused=False, next_due_at=schedule.cadence.next_from(self._now()))

    def fire_due(self) -> int:
        """The timer service's round: every due schedule fired, one transaction each; how many were."""
        fired = 0
        for schedule in sorted(self.rows.values(), key=lambda s: s.next_due_at):
            now = self._now()
            if schedule.paused or schedule.next_due_at > now:
                continue
            next_due = self._all_or_nothing(lambda tx, s=schedule, at=now: fire(  # type: ignore[misc]
                tx, self, s, at, self.admission, clock=self.world.clock))
            self.rows[schedule.schedule_id] = replace(schedule, next_due_at=next_due)
            self.world.admit(schedule.tenant_id)
            fired += 1
        return fired

    def backfill(self, schedule_id: str, start: datetime, end: datetime) -> Backfilled:
        done: Backfilled = self._all_or_nothing(lambda tx: backfill(
            tx, self, self.rows[schedule_id], start, end, self.admission, clock=self.world.clock))
        return done

    def _all_or_nothing(self, use_case: Any) -> Any:
        kept = dict(self.fires)
        try:
            return self.world.in_transaction(use_case)
        except BaseException:
            self.fires = kept
            raise

    # -- ports.schedules.ScheduleRecords ---------------------------------------------------------------
    async def record(self, schedule_id: str, due: datetime, outcome: str, *, run_id: str | None = None,
                     reason: str | None = None, through: datetime | None = None, backfill: bool = False) -> None:
        self.fires.setdefault((schedule_id, due), {"outcome": outcome, "run_id": run_id, "reason": reason,
                                                   "through": through, "backfill": backfill})

    async def now(self) -> datetime:
        return self._now()
