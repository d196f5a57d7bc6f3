"""The operator API's contract for schedules (``domain.schedules``): request bodies, answers and
operations, listed among ``api.OPERATIONS``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from longrun_client.model import TENANT_PATTERN
from pydantic import AwareDatetime, BaseModel, Field

from longrun.cadence import LONGEST_INTERVAL, SHORTEST_INTERVAL
from longrun.services.gateway.api_operation import ACT, READ, Operation
from longrun.services.gateway.api_types import Query, Reason, Strict, Text

OVERLAP = Literal["skip", "buffer_one", "cancel_previous", "allow"]


class ScheduleCreate(Strict):
    """A schedule: runs of ``run.workflow`` on a cron expression or an interval, never two for one due time."""

    tenant_id: Annotated[str, Field(pattern=TENANT_PATTERN)]
    run: dict[str, Any] = Field(description="The run.create payload (version 4) each due time sends, without "
                                            "idempotency_key: workflow, input, priority, budget, labels...")
    cron: Text | None = Field(None, description="Five fields (minute hour day-of-month month day-of-week), UTC.")
    every: float | None = Field(None, ge=SHORTEST_INTERVAL, le=LONGEST_INTERVAL,
                                description="An interval in seconds, instead of cron.")
    anchor: AwareDatetime | None = Field(None, description="Due times are the anchor plus whole intervals (or the "
                                                           "cron matches after it); default: now.")
    overlap: OVERLAP = Field("skip", description="While the schedule's run is open, a due time is skipped, waits "
                                                 "(one at most), cancels it, or runs alongside (allow).")
    catch_up_window: float = Field(300.0, ge=0, le=LONGEST_INTERVAL,
                                   description="Seconds: due times older than this when the timer service "
                                               "looks (it was down) are recorded as missed, not fired.")
    reason: Reason


class ScheduleSteer(Strict):
    """``pause``, ``resume``, ``delete``: the reason is all they take."""

    reason: Reason


class ScheduleBackfill(Strict):
    """Create the runs of the due times in ``[start, end)``, a past range (at most 5000 times)."""

    start: AwareDatetime
    end: AwareDatetime
    reason: Reason


class ScheduleListing(Query):
    tenant_id: Annotated[str, Field(pattern=TENANT_PATTERN)] | None = None


class ScheduleFire(BaseModel):
    due_at: str
    outcome: Literal["created", "skipped", "missed"]
    run_id: str | None
    reason: str | None
    through: str | None = Field(description="missed: the last due time of the range missed.")
    backfill: bool


class ScheduleView(BaseModel):
    schedule_id: str
    tenant_id: str
    workflow: str
    run: dict[str, Any]
    cron: str | None
    every: float | None
    anchor: str
    overlap: OVERLAP
    catch_up_window: float
    paused: bool
    next_due_at: str
    created_by: str
    created_at: str
    fires: list[ScheduleFire] = Field([], description="The latest due times, newest first (in a schedule's view).")


class ScheduleList(BaseModel):
    schedules: list[ScheduleView]


class Backfilled(BaseModel):
    schedule_id: str
    times: int = Field(description="Due times in the range.")
    created: int = Field(description="Runs made now (the others were made before, or refused: see fires).")


def _on_a_schedule(action: str, body: type[BaseModel], response: type[BaseModel], summary: str) -> Operation:
    return Operation("POST", f"/schedules/{{schedule_id}}/{action}", f"{action}Schedule", summary, response,
                     ACT, body, role="operator")


SCHEDULE_OPERATIONS: tuple[Operation, ...] = (
    Operation("GET", "/schedules", "listSchedules", "The schedules of the tenants the caller sees", ScheduleList,
              READ, query=ScheduleListing),
    Operation("POST", "/schedules", "createSchedule", "Create a schedule (422: its run, cadence or overlap is "
              "refused, naming why)", ScheduleView, ACT, ScheduleCreate, role="operator"),
    Operation("GET", "/schedules/{schedule_id}", "showSchedule", "A schedule and what its latest due times did",
              ScheduleView, (400, 401, 403, 404, 503)),
    _on_a_schedule("pause", ScheduleSteer, ScheduleView, "Pause the schedule: no due time fires until resumed"),
    _on_a_schedule("resume", ScheduleSteer, ScheduleView, "Resume the schedule from its next due time after now "
                   "(the times passed while paused are not fired)"),
    _on_a_schedule("backfill", ScheduleBackfill, Backfilled, "Create the runs of a past range's due times "
                   "(a time that has its run keeps it)"),
    _on_a_schedule("delete", ScheduleSteer, ScheduleView, "Delete the schedule (its runs stay)"),
)
