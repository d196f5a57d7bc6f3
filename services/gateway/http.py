"""The gateway's HTTP routes: webhooks (HMAC, dedup, fast 2xx), the operator API, whose requests
are checked against its contract (``longrun.services.gateway.api``, served at ``GET /openapi.json``), and
producers' creates (``POST /runs``, ``longrun.services.gateway.run_create``).

Every operator call names its caller with a bearer token (``longrun.identity``): 401 without a
valid one, 403 when the caller lacks the role the operation needs. A caller sees only its tenants:
a run of another tenant is answered as no run at all (404), a search lists none of them, and the
audit log shows only what concerns its tenants' runs and policies.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from longrun import run_kinds, webhook_providers
from longrun.app import signals
from longrun.app.gateway import operate, webhooks
from longrun.app.timer.schedules import Admission
from longrun.bootstrap import open_artifacts
from longrun.bus.connection import Bus
from longrun.config import Settings
from longrun.config.parse import duration
from longrun.db import artifacts, operator_reads, policies, runs, tokens
from longrun.db import audit as audit_log
from longrun.db.errors import is_transient
from longrun.db.transaction import PgTransaction
from longrun.domain import RunSnapshot, Scope
from longrun.identity import Authenticator
from longrun.principals import BOOTSTRAP_SUBJECT, Principal
from longrun.services.gateway import api, console, edge, live, openapi, reads, refusals, run_create
from longrun.services.gateway import policy_ceiling, run_acts, schedules, tenant_limits_routes, versions
from longrun.services.gateway import quarantine as quarantine_ops

logger = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Response]]
Guarded = Callable[[Request, Principal], Awaitable[Response]]
ATTEMPTS = 4
"""Attempts of one request when the database connection breaks under it (0.1, 0.2, 0.4 s apart)."""
ARTIFACT_CSP = "default-src 'none'; sandbox; frame-ancestors 'none'"
"""An artifact served is never a page: nothing it holds may load, run or be framed."""


def riding_out_database_restarts(handler: Handler) -> Handler:
    """Answer from a fresh connection when the pooled one died with a database restart.

    Pooled connections do not know the server restarted until used; the first request after a
    restart would otherwise get a 500 and a provider that does not redeliver would lose its
    webhook. Every route is safe to run again: webhook intake is deduplicated by event id and
    nothing is committed when the connection breaks before the commit. If the database stays
    away, the caller is told to come back (503), not that the request was wrong.
    """
    @functools.wraps(handler)
    async def answer(request: Request) -> Response:
        try:
            async for attempt in AsyncRetrying(retry=retry_if_exception(is_transient), reraise=True,
                                               stop=stop_after_attempt(ATTEMPTS),
                                               wait=wait_exponential(multiplier=0.1, max=1)):
                with attempt:
                    return await handler(request)
        except Exception as e:
            if not is_transient(e):
                raise
            logger.warning("%s %s: database unavailable: %s", request.method, request.url.path, e)
            return JSONResponse({"error": "database unavailable, try again"}, status_code=503,
                                headers={"retry-after": "2"})
        raise AssertionError("tenacity either returns or raises")
    return answer


class Refused(Exception):
    """The caller is not who may do this: 401 (no valid bearer token) or 403 (the role or scope is missing)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


def create_app(engine: AsyncEngine, bus: Bus, settings: Settings, *, intake: bool = True,
               operator_api: bool = True, hub: live.Hub | None = None) -> Starlette:
    """The gateway's routes: the webhook intake, the operator API, or both (one app for each port:
    ``LONGRUN_WEBHOOK_PORT`` serves the intake apart). ``hub``: the runs' live progress this gateway
    hears (``live``); without it, streams carry status events alone."""
    kinds = run_kinds.load(settings)  # a run terminated here shows its tools' public receipt fields
    providers = webhook_providers.load(settings)
    secrets = webhook_providers.secrets(settings, providers)
    store = open_artifacts(settings, engine)
    authenticator = Authenticator(engine, settings)
    sampled_refusals = refusals.Sampler()
    progress = hub or live.Hub(settings.progress_buffer)

    async def webhook(request: Request) -> Response:
        provider = request.path_params["provider"]
        if provider not in providers:
            return JSONResponse({"error": f"unknown provider {provider!r}"}, status_code=404)
        body = await request.body()
        why = webhooks.refusal(providers[provider].signature, secrets[provider], request.headers, body,
                               now=time.time(), replay_window=settings.webhook_replay_window)
        if why is not None:
            unaudited = sampled_refusals.audit(provider)
            if unaudited is not None:
                async with engine.begin() as conn:
                    await audit_log.audit(conn, actor=f"webhook:{provider}", action="webhook.refused",
                                         target=provider, reason=why,
                                         details={"client": request.client.host if request.client else None,
                                                  "refused_unaudited_before": unaudited})
            return JSONResponse({"error": f"refused: {why}"}, status_code=401)
        try:
            payload = webhooks.parse(body)
            async with engine.begin() as conn:
                outcome = await webhooks.receive(PgTransaction(conn), provider, payload, providers=providers)
        except (ValueError, KeyError, json.JSONDecodeError) as e:
            return JSONResponse({"error": f"malformed event: {e}"}, status_code=400)
        return JSONResponse(outcome, status_code=202)

    async def caller(request: Request, op: api.Operation) -> Principal:
        """Who calls, if they may call ``op``; ``Refused`` otherwise."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        principal = await authenticator.from_bearer(token.strip()) if scheme.lower() == "bearer" else None
        if principal is None:
            raise Refused(401, "missing or bad bearer token")
        assert op.authenticated
        if op.role is not None and not principal.may(op.role):
            raise Refused(403, f"{principal.subject} may not {op.name}: it needs the role {op.role}")
        if op.permission is not None and not principal.holds(op.permission):
            raise Refused(403, f"{principal.subject} may not {op.name}: it needs the permission {op.permission}, "
                               "which no role carries")
        if op.every_tenant and principal.tenants is not None:
            raise Refused(403, f"{principal.subject} may not {op.name}: only a principal of every tenant may")
        return principal

    def guarded(path: str, handler: Guarded) -> Handler:
        """``handler`` called with its caller, once the caller may call the operation of this route."""
        async def answer(request: Request) -> Response:
            return await handler(request, await caller(request, api.BY_ROUTE[(request.method, path)]))
        return answer

    async def act(request: Request) -> Response:
        name = request.path_params["action"]
        op = api.RUN_ACTIONS.get(name)
        principal = await caller(request, op or api.BY_ROUTE[("GET", "/runs/{run_id}")])
        if op is None or op.body is None:
            return JSONResponse({"error": f"no operation {name!r} on a run; one of {', '.join(api.RUN_ACTIONS)}"},
                                status_code=404)
        run_id = api.path_parameter("run_id", request.path_params["run_id"])
        body = api.body(op.body, await request.body())
        try:
            async with engine.begin() as conn:
                await _visible(conn, run_id, principal)
                result = await run_acts.perform(PgTransaction(conn), run_id, name, body, by=principal, kinds=kinds)
        except run_acts.REFUSALS as e:
            problems = {"problems": e.problems} if isinstance(e, operate.AnswerRefused | signals.SignalRefused) else {}
            return JSONResponse({"error": str(e), **problems}, status_code=run_acts.refusal_status(e))
        return JSONResponse(result)

    async def show(request: Request, principal: Principal) -> Response:
        run_id = api.path_parameter("run_id", request.path_params["run_id"])
        async with engine.connect() as conn:
            view = await reads.run_view(conn, run_id, principal.tenants)
        if view is None:
            return JSONResponse({"error": str(operate.RunNotFound(run_id))}, status_code=404)
        return JSONResponse(view)

    async def follow(request: Request, principal: Principal) -> Response:
        return await live.respond(request, engine, progress, principal)

    async def attach(request: Request, principal: Principal) -> Response:
        """POST the artifact's bytes (``Content-Type``: its media type) with ``?name=...&reason=...``."""
        run_id = api.path_parameter("run_id", request.path_params["run_id"])
        params = api.query(api.Attachment, request.query_params)
        async with engine.connect() as conn:
            tenant = await operator_reads.tenant_of(conn, run_id)  # a run's tenant never changes
        if tenant is None or not principal.sees(tenant):
            return JSONResponse({"error": str(operate.RunNotFound(run_id))}, status_code=404)
        data = await request.body()
        if not data or len(data) > settings.max_attachment_bytes:
            return JSONResponse({"error": f"an artifact is 1 to {settings.max_attachment_bytes} bytes "
                                          f"(LONGRUN_MAX_ATTACHMENT_BYTES), got {len(data)}"}, status_code=413)
        media_type = request.headers.get("content-type", "application/octet-stream")
        content_hash = await store.put(tenant, data)  # uploaded before the transaction that refers to it
        try:
            async with engine.begin() as conn:
                result = await operate.attach_artifact(
                    PgTransaction(conn), run_id, name=params.name, content_hash=content_hash, size=len(data),
                    media_type=media_type, actor=principal.subject, reason=params.reason)
                await artifacts.register(conn, store, content_hash, tenant_id=tenant, size=len(data),
                                         media_type=media_type, run_id=run_id)
        except operate.RunNotFound as e:
            return JSONResponse({"error": str(e)}, status_code=404)
        except operate.AttachmentRefused as e:
            return JSONResponse({"error": str(e)}, status_code=422)
        return JSONResponse(result)

    async def artifact(request: Request, principal: Principal) -> Response:
        """An artifact of the run: one attached to it, or a receipt its actions refer to."""
        run_id = api.path_parameter("run_id", request.path_params["run_id"])
        content_hash = api.path_parameter("content_hash", request.path_params["content_hash"])
        async with engine.connect() as conn:
            stored = await runs.load(conn, run_id)
            tenant = stored.snapshot.tenant_id if stored is not None else None
            media_type = None if tenant is None else await artifacts.media_type(conn, tenant, content_hash)
        if (stored is None or tenant is None or media_type is None or not principal.sees(tenant)
                or not _refers_to(stored.snapshot, content_hash)):
            return JSONResponse({"error": f"run {run_id} has no artifact {content_hash}"}, status_code=404)
        # The bytes pass through the gateway from any store (no redirect to the bucket), so these
        # headers hold for every answer: an attachment, never rendered, never sniffed, and no
        # script, style or frame of it runs should a browser render it anyway.
        return Response(await store.get(tenant, content_hash), media_type=media_type, headers={
            "content-disposition": f'attachment; filename="{content_hash}"', "x-content-type-options": "nosniff",
            "content-security-policy": ARTIFACT_CSP})

    async def search(request: Request, principal: Principal) -> Response:
        """Runs of the caller's tenants matching every filter given (``reads.search_runs``)."""
        params = api.query(api.RunSearch, request.query_params)
        try:
            async with engine.connect() as conn:
                return JSONResponse(await reads.search_runs(conn, params, principal.tenants))
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)

    async def audit_trail(request: Request, principal: Principal) -> Response:
        """The audit log as the caller may see it (``reads.audit_entries``); ``/alerts`` is the part of it
        the reconciler raised."""
        params = api.query(api.AuditSearch, request.query_params)
        try:
            async with engine.connect() as conn:
                return JSONResponse(await reads.audit_entries(conn, params, alerts_only=request.url.path == "/alerts",
                                                              tenants=principal.tenants))
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)

    async def versions_in_use(request: Request, principal: Principal) -> Response:
        async with engine.connect() as conn:
            return JSONResponse(await versions.report(conn))

    async def quarantined(request: Request, principal: Principal) -> Response:
        params = api.query(api.QuarantineListing, request.query_params)
        return JSONResponse(await quarantine_ops.list_entries(engine, include_replayed=params.all == "1"))

    async def replay(request: Request, principal: Principal) -> Response:
        entry_id = api.path_parameter("entry_id", request.path_params["entry_id"])
        body = api.body(api.Replay, await request.body())
        try:
            result = await quarantine_ops.replay(engine, bus, entry_id, actor=principal.subject, reason=body.reason,
                                                 replay_window=settings.quarantine_replay_window)
        except quarantine_ops.NoSuchEntry as e:
            return JSONResponse({"error": str(e)}, status_code=404)
        except quarantine_ops.NotReplayable as e:
            return JSONResponse({"error": str(e)}, status_code=409)
        return JSONResponse(result)

    async def tenant_policy(request: Request, principal: Principal) -> Response:
        """GET: the tenant's policy; PUT ``{"tools": [...], "resources": [...], "reason"}``: replace it
        (audited), under the next version. Runs created from then on are narrowed by it; approved calls
        of runs created before are re-validated under it."""
        tenant = api.path_parameter("tenant_id", request.path_params["tenant_id"])
        actor = principal.subject
        if not principal.sees(tenant):
            return JSONResponse({"error": f"no tenant {tenant!r} among those {actor} sees"}, status_code=404)
        if request.method == "GET":
            async with engine.connect() as conn:
                policy = await policies.load(conn, tenant)
            if policy is None:
                return JSONResponse({"error": f"tenant {tenant!r} has no policy: its runs may do what their "
                                              "kind allows"}, status_code=404)
            return JSONResponse(policy_ceiling.policy_json(policy))
        body = api.body(api.PolicyChange, await request.body())
        try:
            scope = Scope(tuple(body.tools), tuple(body.resources))
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=422)
        try:
            async with engine.begin() as conn:
                policy = await policy_ceiling.set_policy(conn, tenant, scope, actor=actor, reason=body.reason,
                                                         every_tenant=principal.tenants is None)
        except policy_ceiling.BeyondCeiling as e:
            return JSONResponse({"error": str(e)}, status_code=403)
        return JSONResponse(policy_ceiling.policy_json(policy))

    async def tenant_ceiling(request: Request, principal: Principal) -> Response:
        """GET: how far the tenant's own admins may set its policy; PUT ``{"tools", "resources", "reason"}``
        (an admin of every tenant): replace it (audited), under the next version."""
        tenant = api.path_parameter("tenant_id", request.path_params["tenant_id"])
        if not principal.sees(tenant):
            return JSONResponse({"error": f"no tenant {tenant!r} among those {principal.subject} sees"},
                                status_code=404)
        if request.method == "GET":
            async with engine.connect() as conn:
                return JSONResponse(policy_ceiling.ceiling_json(await policy_ceiling.ceiling(conn, tenant)))
        body = api.body(api.PolicyChange, await request.body())
        try:
            scope = Scope(tuple(body.tools), tuple(body.resources))
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=422)
        async with engine.begin() as conn:
            held = await policy_ceiling.set_ceiling(conn, tenant, scope, actor=principal.subject, reason=body.reason)
        return JSONResponse(policy_ceiling.ceiling_json(held))

    async def me(request: Request, principal: Principal) -> Response:
        return JSONResponse({"subject": principal.subject, "roles": sorted(principal.roles),
                             "permissions": sorted(principal.permissions),
                             "tenants": None if principal.tenants is None else sorted(principal.tenants),
                             "groups": sorted(principal.groups)})

    async def token_list(request: Request, principal: Principal) -> Response:
        params = api.query(api.TokenListing, request.query_params)
        async with engine.connect() as conn:
            found = await tokens.listing(conn, include_revoked=params.all == "1")
        return JSONResponse([t.to_dict() for t in found])

    async def token_create(request: Request, principal: Principal) -> Response:
        """A named token; its secret is in this answer and nowhere else."""
        body = api.body(api.TokenRequest, await request.body())
        if body.name == BOOTSTRAP_SUBJECT:
            return JSONResponse({"error": f"the name {BOOTSTRAP_SUBJECT!r} is the bootstrap tokens': choose "
                                          "another"}, status_code=422)
        try:
            expires_in = None if body.expires_in is None else duration(body.expires_in)
        except (ValueError, OverflowError):
            return JSONResponse({"error": f"expires_in: not a duration ({api.DURATION}): {body.expires_in!r}"},
                                status_code=422)
        try:
            async with engine.begin() as conn:
                token, secret = await tokens.create(conn, name=body.name, roles=tuple(body.roles),
                                                    permissions=tuple(body.permissions),
                                                    tenants=None if body.tenants is None else tuple(body.tenants),
                                                    created_by=principal.subject, expires_in=expires_in)
                await audit_log.audit(conn, actor=principal.subject, action="token.create",
                                     target=f"token:{token.id}", reason=body.reason,
                                     details={"name": token.name, "roles": list(token.roles),
                                              "permissions": list(token.permissions), "tenants": body.tenants,
                                              "expires_at": token.to_dict()["expires_at"]})
        except tokens.NameInUse as e:
            return JSONResponse({"error": str(e)}, status_code=409)
        return JSONResponse({"token": token.to_dict(), "secret": secret})

    async def token_revoke(request: Request, principal: Principal) -> Response:
        token_id = api.path_parameter("token_id", request.path_params["token_id"])
        body = api.body(api.Revoke, await request.body())
        async with engine.begin() as conn:
            token = await tokens.revoke(conn, token_id)
            if token is None:
                return JSONResponse({"error": f"no token {token_id}"}, status_code=404)
            await audit_log.audit(conn, actor=principal.subject, action="token.revoke", target=f"token:{token_id}",
                                 reason=body.reason, details={"name": token.name})
        return JSONResponse(token.to_dict())

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    limits_routes = tenant_limits_routes.Routes(engine, settings.tenant_defaults())
    schedule_routes = schedules.Routes(engine, Admission(kinds, settings.partitions, settings.tenant_slots,
                                                         settings.max_input_bytes))
    contract = openapi.document()

    async def described(request: Request) -> Response:
        return JSONResponse(contract)

    ride = riding_out_database_restarts

    def route(path: str, handler: Guarded, methods: list[str]) -> Route:
        return Route(path, ride(guarded(path, handler)), methods=methods)

    intake_routes = [Route("/webhooks/{provider}", ride(webhook), methods=["POST"])]
    operations = [
        route("/runs", search, ["GET"]),
        route("/runs", run_create.create_route(engine, settings, kinds), ["POST"]),
        route("/runs/{run_id}", show, ["GET"]),
        route("/runs/{run_id}/events/stream", follow, ["GET"]),
        route("/runs/{run_id}/artifacts", attach, ["POST"]),
        route("/runs/{run_id}/artifacts/{content_hash}", artifact, ["GET"]),
        Route("/runs/{run_id}/{action}", ride(act), methods=["POST"]),
        route("/versions", versions_in_use, ["GET"]),
        route("/audit", audit_trail, ["GET"]),
        route("/alerts", audit_trail, ["GET"]),
        route("/quarantine", quarantined, ["GET"]),
        route("/quarantine/{entry_id}/replay", replay, ["POST"]),
        route("/tenants/{tenant_id}/policy", tenant_policy, ["GET", "PUT"]),
        route("/tenants/{tenant_id}/ceiling", tenant_ceiling, ["GET", "PUT"]),
        route("/tenants/{tenant_id}/limits", limits_routes.limits, ["GET", "PUT"]),
        route("/tenants/{tenant_id}/limits/ceiling", limits_routes.limits_ceiling, ["PUT"]),
        route("/schedules", schedule_routes.collection, ["GET", "POST"]),
        route("/schedules/{schedule_id}", schedule_routes.show, ["GET"]),
        *(route(f"/schedules/{{schedule_id}}/{act}", getattr(schedule_routes, act), ["POST"])
          for act in ("pause", "resume", "backfill", "delete")),
        route("/me", me, ["GET"]),
        route("/tokens", token_list, ["GET"]),
        route("/tokens", token_create, ["POST"]),
        route("/tokens/{token_id}/revoke", token_revoke, ["POST"]),
        Route("/openapi.json", described, methods=["GET"]),
        Mount(console.PREFIX, console.create_console(engine, bus, settings, kinds, ride, progress)),
    ]
    limits = [edge.Limit(re.compile(r"/webhooks/[^/]+"), edge.WEBHOOK_BYTES, "a webhook delivery"),
              # An input up to the limit admission takes, and a body's worth of room for the rest of the create.
              edge.Limit(re.compile("/runs"), settings.max_input_bytes + edge.JSON_BYTES,
                         "a run.create (LONGRUN_MAX_INPUT_BYTES and the envelope)", method="POST"),
              edge.Limit(re.compile(r"/runs/[^/]+/artifacts"), settings.max_attachment_bytes,
                         "an artifact (LONGRUN_MAX_ATTACHMENT_BYTES)", method="POST"),
              edge.Limit(re.compile(f"{console.PREFIX}(/.*)?"), edge.FORM_BYTES, "a console form")]
    return Starlette(routes=[*(intake_routes if intake else []), *(operations if operator_api else []),
                             Route("/healthz", healthz, methods=["GET"])],
                     middleware=[Middleware(edge.Edge, limits=limits,
                                            default=edge.Limit(re.compile(".*"), edge.JSON_BYTES, "a request body"))],
                     exception_handlers={HTTPException: _http_error, api.Invalid: _invalid, Refused: _refused})


async def _refused(request: Request, e: Exception) -> Response:
    assert isinstance(e, Refused)
    return JSONResponse({"error": str(e)}, status_code=e.status,
                        headers={"www-authenticate": "Bearer"} if e.status == 401 else None)


async def _visible(conn: AsyncConnection, run_id: str, principal: Principal) -> None:
    """``RunNotFound`` for a run the principal does not see, as for one that does not exist: a
    caller learns nothing of other tenants' runs."""
    if principal.tenants is None:
        return
    tenant = await operator_reads.tenant_of(conn, run_id)
    if tenant is None or not principal.sees(tenant):
        raise operate.RunNotFound(run_id)


async def _invalid(request: Request, e: Exception) -> Response:
    """A request outside the contract (``longrun.services.gateway.api``), refused naming every problem."""
    assert isinstance(e, api.Invalid)
    return JSONResponse(e.body(), status_code=e.status)


async def _http_error(request: Request, e: Exception) -> Response:
    """No route, or not this method on it: said in JSON like every other refusal."""
    assert isinstance(e, HTTPException)
    return JSONResponse({"error": f"{request.method} {request.url.path}: {e.detail}"}, status_code=e.status_code,
                        headers=e.headers)


def _refers_to(run: RunSnapshot, content_hash: str) -> bool:
    attached = (f.value for f in run.facts if f.key.startswith(operate.ARTIFACT_FACT_PREFIX))
    return any(isinstance(v, Mapping) and v.get("content_hash") == content_hash for v in attached) or any(
        a.receipt_ref == content_hash for a in run.actions)
