"""The operator API's routes for a tenant's limits (``tenant_limits``): ``GET``/``PUT
/tenants/{tenant_id}/limits`` and ``PUT /tenants/{tenant_id}/limits/ceiling``."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from longrun.domain.tenant_limits import PlatformDefaults, TenantLimits
from longrun.principals import Principal
from longrun.services.gateway import api, tenant_limits


class Routes:
    def __init__(self, engine: AsyncEngine, defaults: PlatformDefaults) -> None:
        self.engine = engine
        self.defaults = defaults

    async def limits(self, request: Request, principal: Principal) -> Response:
        """GET: the tenant's limits; PUT ``{"run_slots", "token_budget", "cost_budget", "tool_concurrency",
        "reason"}``: replace them (audited), under the next version."""
        tenant = api.path_parameter("tenant_id", request.path_params["tenant_id"])
        if not principal.sees(tenant):
            return JSONResponse({"error": f"no tenant {tenant!r} among those {principal.subject} sees"},
                                status_code=404)
        if request.method == "GET":
            async with self.engine.connect() as conn:
                return JSONResponse(await tenant_limits.view(conn, tenant, self.defaults))
        body = api.body(api.LimitsChange, await request.body())
        limits = TenantLimits(tenant, body.run_slots, body.token_budget, body.cost_budget, body.tool_concurrency)
        try:
            async with self.engine.begin() as conn:
                shown = await tenant_limits.set_limits(conn, limits, self.defaults, actor=principal.subject,
                                                       every_tenant=principal.tenants is None, reason=body.reason)
        except tenant_limits.BeyondCeiling as e:
            return JSONResponse({"error": str(e)}, status_code=403)
        return JSONResponse(shown)

    async def limits_ceiling(self, request: Request, principal: Principal) -> Response:
        """PUT (an admin of every tenant) the ceilings of the limits the body names; null: unbounded."""
        tenant = api.path_parameter("tenant_id", request.path_params["tenant_id"])
        body = api.body(api.LimitsCeilingChange, await request.body())
        asked = {name: getattr(body, name) for name in body.model_fields_set if name != "reason"}
        async with self.engine.begin() as conn:
            held = await tenant_limits.set_limits_ceiling(conn, tenant, asked, self.defaults,
                                                          actor=principal.subject, reason=body.reason)
        return JSONResponse(tenant_limits.ceiling_json(held))
