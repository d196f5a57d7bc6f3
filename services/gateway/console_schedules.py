"""The console's schedules page: the schedules of the tenants the operator sees (``?tenant_id=`` for
one), what each did last, and pause / resume for those who may (the operator API's role for them),
each a CSRF-checked form, audited as the API's acts are (``schedules.steer``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from longrun.db import schedules as schedule_rows
from longrun.principals import Principal
from longrun.services.gateway import api, schedules
from longrun.services.gateway.api_schedules import ScheduleListing, ScheduleSteer

Page = Callable[..., Response]
Signed = Callable[[Callable[[Request, Any, Principal], Awaitable[Response]]], Callable[[Request], Awaitable[Response]]]
LIST = ("GET", "/schedules")
PAUSE = ("POST", "/schedules/{schedule_id}/pause")


def routes(engine: AsyncEngine, page: Page, signed: Signed, may: Callable[[Principal, api.Operation], None],
           allowed: Callable[[Principal, api.Operation], bool], refused: Callable[[int, str], Exception],
           model: Callable[..., Any], prefix: str) -> list[Route]:
    async def listing(request: Request, seen: Any, principal: Principal) -> Response:
        may(principal, api.BY_ROUTE[LIST])
        # The page's own parameters (a notice after an act, a blank tenant) are not the API's filters.
        asked = api.query(ScheduleListing, QueryParams([(k, v) for k, v in request.query_params.multi_items()
                                                         if k == "tenant_id" and v]))
        async with engine.connect() as conn:
            found = await schedules.visible(conn, principal, asked.tenant_id)
            last = {s.schedule_id: (await schedule_rows.fires(conn, s.schedule_id, limit=1) or [None])[0]
                    for s in found}
        return page(request, seen, "schedules.html", schedules=[{**s.json(), "last": last[s.schedule_id]}
                                                                 for s in found],
                    tenant=asked.tenant_id, may_steer=allowed(principal, api.BY_ROUTE[PAUSE]))

    async def steer(request: Request, seen: Any, principal: Principal) -> Response:
        act = request.path_params["act"]
        if act not in ("pause", "resume"):
            raise refused(404, f"No console action {act!r} on a schedule: pause or resume.")
        may(principal, api.BY_ROUTE[("POST", f"/schedules/{{schedule_id}}/{act}")])
        schedule_id = api.path_parameter("schedule_id", request.path_params["schedule_id"])
        body = model(ScheduleSteer, reason=request.state.form.get("reason"))
        try:
            async with engine.begin() as conn:
                await schedules.steer(conn, schedule_id, principal, paused=act == "pause", reason=body.reason)
        except schedules.NotFound as e:
            raise refused(404, f"{e}.") from e
        except schedules.AlreadySo as e:
            raise refused(409, f"{e}.") from e
        return RedirectResponse(f"{prefix}/schedules?notice=schedule-{act}d", status_code=303)

    return [Route("/schedules", signed(listing), methods=["GET"]),
            Route("/schedules/{schedule_id}/{act:str}", signed(steer), methods=["POST"])]
