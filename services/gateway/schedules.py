"""The operator API's routes for schedules (``app.timer.schedules``): create, list, show, pause, resume,
backfill and delete, each within the tenants the caller sees (another tenant's schedule is not found)
and audited (``schedule.<act>``)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from longrun_client.payloads import RunCreateV4
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from longrun.app.timer.schedules import Admission, backfill
from longrun.db import audit as audit_log
from longrun.db import schedules
from longrun.db.schedules import PgScheduleRecords
from longrun.db.transaction import PgTransaction
from longrun.cadence import Cadence, Schedule, cadence_problem
from longrun.domain.schedules import Overlap
from longrun.principals import Principal
from longrun.services.gateway import api
from longrun.services.gateway.api_schedules import ScheduleBackfill, ScheduleCreate, ScheduleListing, ScheduleSteer

ANCHOR_REACH = timedelta(days=3660)
"""How far from now an anchor, and a backfill's start, may be."""


class NotFound(Exception):
    pass


class AlreadySo(Exception):
    """Paused (or resumed) already."""


async def steer(conn: AsyncConnection, schedule_id: str, principal: Principal, *, paused: bool,
                reason: str) -> Schedule:
    """Pause or resume the schedule (audited); the API's and the console's act."""
    schedule = await _find(conn, schedule_id, principal, lock=True)
    if schedule.paused == paused:
        raise AlreadySo(f"schedule {schedule_id} is {'paused' if paused else 'not paused'} already")
    # Resumed, it goes on from its next due time after now: the times passed while paused are not fired.
    next_due = None if paused else schedule.cadence.next_from(await schedules.now(conn))
    await schedules.set_paused(conn, schedule_id, paused, next_due)
    await _audit(conn, principal, "pause" if paused else "resume", schedule, reason, {})
    changed = await schedules.get(conn, schedule_id)
    assert changed is not None
    return changed


async def visible(conn: AsyncConnection, principal: Principal, tenant: str | None) -> list[Schedule]:
    """The schedules of ``tenant`` (None: every tenant) that ``principal`` sees."""
    return await schedules.listed(conn, None if principal.tenants is None else list(principal.tenants), tenant)


async def _find(conn: AsyncConnection, schedule_id: str, principal: Principal, *, lock: bool = False) -> Schedule:
    schedule = await schedules.get(conn, schedule_id, lock=lock)
    if schedule is None or not principal.sees(schedule.tenant_id):
        raise NotFound(f"no schedule {schedule_id!r} among those {principal.subject} sees")
    return schedule


async def _audit(conn: AsyncConnection, principal: Principal, act: str, schedule: Schedule, reason: str,
                 details: dict[str, Any]) -> None:
    await audit_log.audit(conn, actor=principal.subject, action=f"schedule.{act}", target=schedule.schedule_id,
                          reason=reason, details=details, tenant=schedule.tenant_id)


class Routes:
    def __init__(self, engine: AsyncEngine, admission: Admission) -> None:
        self.engine = engine
        self.admission = admission

    async def collection(self, request: Request, principal: Principal) -> Response:
        """GET: the schedules the caller sees (``?tenant_id=``); POST: create one."""
        if request.method == "GET":
            asked = api.query(ScheduleListing, request.query_params)
            async with self.engine.connect() as conn:
                found = await visible(conn, principal, asked.tenant_id)
            return JSONResponse({"schedules": [s.json() for s in found]})
        body = api.body(ScheduleCreate, await request.body())
        if not principal.sees(body.tenant_id):
            return _missing(f"no tenant {body.tenant_id!r} among those {principal.subject} sees")
        problem = cadence_problem(body.cron, body.every) or self._run_problem(body.run)
        if problem is not None:
            return JSONResponse({"error": problem}, status_code=422)
        async with self.engine.begin() as conn:
            now = await schedules.now(conn)
            if body.anchor is not None and abs(body.anchor - now) > ANCHOR_REACH:
                return JSONResponse({"error": f"anchor is at most {ANCHOR_REACH.days} days from now"}, status_code=422)
            cadence = Cadence(body.anchor or now, body.cron, body.every)
            schedule = Schedule(f"sched-{uuid.uuid4()}", body.tenant_id, body.run, cadence, Overlap(body.overlap),
                                body.catch_up_window, False, cadence.next_from(now), principal.subject, now)
            await schedules.insert(conn, schedule)
            await _audit(conn, principal, "create", schedule, body.reason,
                              {"workflow": body.run["workflow"], "cron": body.cron, "every": body.every,
                               "overlap": body.overlap})
        return JSONResponse(schedule.json())

    def _run_problem(self, run: dict[str, Any]) -> str | None:
        """Why the run a schedule sends would be refused at every due time; None when it would not."""
        if "idempotency_key" in run:
            return "run.idempotency_key is made for each due time (the schedule and the time); leave it out"
        try:
            request = RunCreateV4.model_validate({**run, "idempotency_key": "schedule"})
        except ValidationError as e:
            return "run is not a run.create payload: " + "; ".join(
                f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors(include_url=False))
        kinds = self.admission.kinds
        if not kinds.known(request.workflow):
            return f"unknown workflow {request.workflow!r}"
        try:
            kind = (kinds.get(request.workflow, request.workflow_version) if request.workflow_version
                    else kinds.newest(request.workflow))
        except LookupError as e:
            return str(e)
        problems = kind.input_problems(request.input)
        return f"run.input does not match the input schema of {kind.name!r}: {'; '.join(problems[:10])}" \
            if problems else None

    @staticmethod
    def _id(request: Request) -> str:
        found: str = api.path_parameter("schedule_id", request.path_params["schedule_id"])
        return found

    async def show(self, request: Request, principal: Principal) -> Response:
        async with self.engine.connect() as conn:
            try:
                schedule = await _find(conn, self._id(request), principal)
            except NotFound as e:
                return _missing(str(e))
            return JSONResponse({**schedule.json(), "fires": await schedules.fires(conn, schedule.schedule_id)})

    async def pause(self, request: Request, principal: Principal) -> Response:
        return await self._steer(request, principal, paused=True)

    async def resume(self, request: Request, principal: Principal) -> Response:
        return await self._steer(request, principal, paused=False)

    async def _steer(self, request: Request, principal: Principal, *, paused: bool) -> Response:
        body = api.body(ScheduleSteer, await request.body())
        try:
            async with self.engine.begin() as conn:
                changed = await steer(conn, self._id(request), principal, paused=paused, reason=body.reason)
        except NotFound as e:
            return _missing(str(e))
        except AlreadySo as e:
            return JSONResponse({"error": str(e)}, status_code=409)
        return JSONResponse(changed.json())

    async def backfill(self, request: Request, principal: Principal) -> Response:
        body = api.body(ScheduleBackfill, await request.body())
        async with self.engine.begin() as conn:
            try:
                schedule = await _find(conn, self._id(request), principal, lock=True)
                done = await backfill(PgTransaction(conn), PgScheduleRecords(conn), schedule, body.start, body.end,
                                      self.admission)
            except NotFound as e:
                return _missing(str(e))
            except ValueError as e:
                return JSONResponse({"error": str(e)}, status_code=422)
            await _audit(conn, principal, "backfill", schedule, body.reason,
                         {"start": body.start.isoformat(), "end": body.end.isoformat(), "times": done.times,
                          "created": done.created})
        return JSONResponse({"schedule_id": schedule.schedule_id, "times": done.times, "created": done.created})

    async def delete(self, request: Request, principal: Principal) -> Response:
        body = api.body(ScheduleSteer, await request.body())
        async with self.engine.begin() as conn:
            try:
                schedule = await _find(conn, self._id(request), principal, lock=True)
            except NotFound as e:
                return _missing(str(e))
            await schedules.delete(conn, schedule.schedule_id)
            await _audit(conn, principal, "delete", schedule, body.reason, {})
        return JSONResponse(schedule.json())


def _missing(error: str) -> Response:
    return JSONResponse({"error": error}, status_code=404)
