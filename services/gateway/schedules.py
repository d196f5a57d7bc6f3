"""The operator API's routes for schedules (``app.timer.schedules``): create, list, show, pause, resume,
backfill and delete, each within the tenants the caller sees (another tenant's schedule is not found)
and audited (``schedule.<act>``)."""

from __future__ import annotations

import uuid
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

class NotFound(Exception):
    pass


class Routes:
    def __init__(self, engine: AsyncEngine, admission: Admission) -> None:
        self.engine = engine
        self.admission = admission

    async def collection(self, request: Request, principal: Principal) -> Response:
        """GET: the schedules the caller sees (``?tenant_id=``); POST: create one."""
        if request.method == "GET":
            asked = api.query(ScheduleListing, request.query_params)
            async with self.engine.connect() as conn:
                found = await schedules.listed(conn, None if principal.tenants is None else list(principal.tenants),
                                               asked.tenant_id)
            return JSONResponse({"schedules": [s.json() for s in found]})
        body = api.body(ScheduleCreate, await request.body())
        if not principal.sees(body.tenant_id):
            return _missing(f"no tenant {body.tenant_id!r} among those {principal.subject} sees")
        problem = cadence_problem(body.cron, body.every) or self._run_problem(body.run)
        if problem is not None:
            return JSONResponse({"error": problem}, status_code=422)
        async with self.engine.begin() as conn:
            now = await schedules.now(conn)
            cadence = Cadence(body.anchor or now, body.cron, body.every)
            schedule = Schedule(f"sched-{uuid.uuid4()}", body.tenant_id, body.run, cadence, Overlap(body.overlap),
                                body.catch_up_window, False, cadence.next_from(now), principal.subject, now)
            await schedules.insert(conn, schedule)
            await self._audit(conn, principal, "create", schedule, body.reason,
                              {"workflow": body.run["workflow"], "cron": body.cron, "every": body.every,
                               "overlap": body.overlap})
        return JSONResponse(schedule.json(), status_code=201)

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

    async def show(self, request: Request, principal: Principal) -> Response:
        async with self.engine.connect() as conn:
            try:
                schedule = await self._visible(conn, request, principal)
            except NotFound as e:
                return _missing(str(e))
            return JSONResponse({**schedule.json(), "fires": await schedules.fires(conn, schedule.schedule_id)})

    async def pause(self, request: Request, principal: Principal) -> Response:
        return await self._steer(request, principal, paused=True)

    async def resume(self, request: Request, principal: Principal) -> Response:
        return await self._steer(request, principal, paused=False)

    async def _steer(self, request: Request, principal: Principal, *, paused: bool) -> Response:
        body = api.body(ScheduleSteer, await request.body())
        async with self.engine.begin() as conn:
            try:
                schedule = await self._visible(conn, request, principal, lock=True)
            except NotFound as e:
                return _missing(str(e))
            if schedule.paused == paused:
                return JSONResponse({"error": f"schedule {schedule.schedule_id} is "
                                              f"{'paused' if paused else 'not paused'} already"}, status_code=409)
            # Resumed, it goes on from its next due time after now: the times passed while paused are not fired.
            next_due = None if paused else schedule.cadence.next_from(await schedules.now(conn))
            await schedules.set_paused(conn, schedule.schedule_id, paused, next_due)
            await self._audit(conn, principal, "pause" if paused else "resume", schedule, body.reason, {})
            changed = await schedules.get(conn, schedule.schedule_id)
        assert changed is not None
        return JSONResponse(changed.json())

    async def backfill(self, request: Request, principal: Principal) -> Response:
        body = api.body(ScheduleBackfill, await request.body())
        async with self.engine.begin() as conn:
            try:
                schedule = await self._visible(conn, request, principal, lock=True)
                done = await backfill(PgTransaction(conn), PgScheduleRecords(conn), schedule, body.start, body.end,
                                      self.admission)
            except NotFound as e:
                return _missing(str(e))
            except ValueError as e:
                return JSONResponse({"error": str(e)}, status_code=422)
            await self._audit(conn, principal, "backfill", schedule, body.reason,
                              {"start": body.start.isoformat(), "end": body.end.isoformat(),
                               "times": done.times, "created": done.created})
        return JSONResponse({"schedule_id": schedule.schedule_id, "times": done.times, "created": done.created})

    async def delete(self, request: Request, principal: Principal) -> Response:
        body = api.body(ScheduleSteer, await request.body())
        async with self.engine.begin() as conn:
            try:
                schedule = await self._visible(conn, request, principal, lock=True)
            except NotFound as e:
                return _missing(str(e))
            await schedules.delete(conn, schedule.schedule_id)
            await self._audit(conn, principal, "delete", schedule, body.reason, {})
        return JSONResponse(schedule.json())

    @staticmethod
    async def _visible(conn: AsyncConnection, request: Request, principal: Principal, *,
                       lock: bool = False) -> Schedule:
        schedule_id = api.path_parameter("schedule_id", request.path_params["schedule_id"])
        schedule = await schedules.get(conn, schedule_id, lock=lock)
        if schedule is None or not principal.sees(schedule.tenant_id):
            raise NotFound(f"no schedule {schedule_id!r} among those {principal.subject} sees")
        return schedule

    @staticmethod
    async def _audit(conn: AsyncConnection, principal: Principal, act: str, schedule: Schedule, reason: str,
                     details: dict[str, Any]) -> None:
        await audit_log.audit(conn, actor=principal.subject, action=f"schedule.{act}", target=schedule.schedule_id,
                              reason=reason, details=details, tenant=schedule.tenant_id)


def _missing(error: str) -> Response:
    return JSONResponse({"error": error}, status_code=404)
