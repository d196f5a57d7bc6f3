"""The web console, served by the gateway under ``/console``: run search, a run's live timeline, its
pending approval (what exactly is approved, and the hash) with approve and deny, and every other act
of the operator API on a run (answer, resolve, retry an action, pause, resume, retry, cancel,
terminate, migrate), the quarantine with replay, a tenant's limits, and the audit log.

Server-rendered HTML (Jinja2 templates in ``templates/console``) rather than a front end built from
npm packages: there is no build step to run, ship or keep in step with the API; nothing is fetched
from outside, so it works on an air-gapped cluster; every page is a URL an operator can bookmark or
paste into an incident; and each page reads and acts through the same functions as the operator API
(``longrun.services.gateway.reads``; a run's acts through ``run_acts``, its forms read by
``console_acts``), so the console cannot drift from it. The one script is the run page's: it follows
``/console/runs/{id}/stream`` (the run's live stream, ``live``, as Server-Sent Events), shows its
calls' progress and output chunks as they come, and reloads the page when the run recorded a new
event, unless the operator is typing into one of its forms.

Sign-in: the operator pastes a named API token (``longrunctl token create``) or, where an OIDC
issuer is configured and the console is its client, signs in there (``console_oidc``). The session
cookie (``longrun_console``, ``console_session``) holds a random session id and no token; the session
is kept in PostgreSQL (``longrun.db.console_sessions``) with what is asked again of its token on every
request (``Authenticator.still``), so a revoked or expired token ends the session, and so does
sign-out, for every copy of the cookie. Every form carries the session's CSRF token and every POST
without it is refused (403).
The console's routes are not in the operator API's contract (``schemas/openapi.json``): they answer
HTML to a browser session, not JSON to a bearer token. What an operator sees and does is bounded by
their principal under the API's rules (``api.OPERATIONS``: each operation's role, every tenant or
not): a run of a tenant they do not see is "not found", whatever its URL; every act records the
principal's subject as its actor.
"""

from __future__ import annotations

import hmac
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from longrun_client import timeline
from longrun.app.gateway import operate
from longrun.authoring import Registry
from longrun.bus.connection import Bus
from longrun.config import Settings
from longrun.db import console_sessions as kept_sessions
from longrun.db.transaction import PgTransaction
from longrun.domain import RECEIPT_FACT_PREFIX, TERMINAL, UNRECONCILED, ActionStatus, RunStatus, Wait, from_plain
from longrun.identity import Authenticator, Vouched
from longrun.principals import Principal
from longrun.domain.tenant_limits import TenantLimits
from longrun.services.gateway import api, console_acts, console_limits, console_schedules, live, reads, run_acts
from longrun.services.gateway import tenant_limits
from longrun.services.gateway import console_oidc as oidc
from longrun.services.gateway import console_session as sessions
from longrun.services.gateway import quarantine as quarantine_ops
from longrun.services.gateway.console_headers import SecurityHeaders

PREFIX = "/console"
LIMITS = "/tenants/{tenant_id}/limits"
_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates" / "console"),
    autoescape=True, undefined=jinja2.StrictUndefined)
_TEMPLATES.filters["when"] = lambda at: "none" if at is None else datetime.fromtimestamp(at, UTC).isoformat(
    timespec="seconds")
NOTICES = {"approved": "Approved.", "denied": "Denied.", "answered": "Answer recorded.",
           "resolved": "Resolution recorded.", "action-retried": "The action is sent again under its key.",
           "retried": "Sent back to work.", "paused": "Paused.", "resumed": "Resumed.",
           "cancelled": "Cancel requested: the run's cleanup runs.", "terminated": "Terminated.",
           "migrated": "Moved to the new version.", "signalled": "Signal recorded.", "replayed": "Replay done.", "signed-out": "Signed out.",
           "ended": "Your session ended: its token is no longer accepted. Sign in again.",
           "saved": "Limits saved: they hold now.", "schedule-paused": "Schedule paused.",
           "schedule-resumed": "Schedule resumed."}
"""What a redirect after an act says on the page it lands on (by name: a URL cannot make it say more)."""


@dataclass(frozen=True, slots=True)
class Visit:
    """One request's session and who it is (None: not signed in)."""

    session: sessions.Session
    principal: Principal | None
    fresh: bool
    """The session was made for this request: its cookie must be set on the answer."""
    ended: bool = False
    """The cookie's session was signed in with a token no longer accepted (revoked, expired): it is over."""


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def create_console(engine: AsyncEngine, bus: Bus, settings: Settings, kinds: Registry,
                   ride: Callable[[Callable[[Request], Awaitable[Response]]],
                                  Callable[[Request], Awaitable[Response]]], hub: live.Hub) -> Starlette:
    """The console's app, mounted at ``PREFIX``; ``kinds``: the run kinds deployed here (a migration's
    targets); ``ride`` wraps each page as the API's routes are (answering from a fresh connection after
    a database restart); ``hub``: the runs' live progress."""
    authenticator = Authenticator(engine, settings)
    defaults = settings.tenant_defaults()
    key = settings.console_secret

    async def visit(request: Request) -> Visit:
        now = time.time()
        session = sessions.unseal(key, request.cookies.get(sessions.cookie_name(request.url.scheme == "https")), now)
        if session is None:
            return Visit(sessions.new(now), None, fresh=True)
        async with engine.begin() as conn:
            kept = await kept_sessions.find(conn, session.id)
            principal = None if kept is None else authenticator.still(kept)
            if kept is not None and principal is None:
                await kept_sessions.end(conn, session.id)
        if kept is None:  # never signed in, signed out, or over
            return Visit(session, None, fresh=False)
        if principal is None:
            return Visit(sessions.new(now), None, fresh=True, ended=True)
        return Visit(session, principal, fresh=False)

    async def signed_in(request: Request, seen: Visit, vouched: Vouched) -> Response:
        """A session kept for the principal under a new id (one seen before sign-in is worthless
        after), ending the one this browser had; off to the runs."""
        now = time.time()
        session = sessions.new(now)
        lifetime = sessions.LIFETIME if vouched.expires is None else max(0.0, min(sessions.LIFETIME,
                                                                                  vouched.expires - now))
        async with engine.begin() as conn:
            if seen.principal is not None:
                await kept_sessions.end(conn, seen.session.id)
            await kept_sessions.open_session(conn, session.id, vouched.principal, token_id=vouched.token_id,
                                             bootstrap_sha256=vouched.bootstrap_sha256, lifetime=lifetime)
        response = RedirectResponse(f"{PREFIX}/runs", status_code=303)
        _set_cookie(response, request, sessions.seal(key, session))
        return response

    def page(request: Request, seen: Visit, template: str, status: int = 200, **values: Any) -> Response:
        notice = NOTICES.get(request.query_params.get("notice", ""))
        html = _TEMPLATES.get_template(template).render(
            root=PREFIX, principal=seen.principal, csrf=sessions.csrf_token(key, seen.session), notice=notice,
            oidc=oidc.offered(settings), nonce=request.state.csp_nonce, **values)
        response = HTMLResponse(html, status_code=status)
        if seen.fresh:
            _set_cookie(response, request, sessions.seal(key, seen.session))
        return response

    def signed(handler: Callable[[Request, Visit, Principal], Awaitable[Response]]
               ) -> Callable[[Request], Awaitable[Response]]:
        """A page for signed-in operators: anyone else is sent to sign in (a POST is refused)."""
        async def answer(request: Request) -> Response:
            seen = await visit(request)
            if seen.principal is None:
                if request.method == "POST":
                    return page(request, seen, "error.html", 401, message="Sign in first.")
                response = RedirectResponse(f"{PREFIX}/sign-in{'?notice=ended' if seen.ended else ''}",
                                            status_code=303)
                if seen.fresh:
                    _set_cookie(response, request, sessions.seal(key, seen.session))
                return response
            try:
                _may(seen.principal, api.BY_ROUTE[("GET", "/runs")])  # a principal with no role sees nothing
                if request.method == "POST":
                    form = await _form(request)
                    if not sessions.csrf_ok(key, seen.session, form.get("csrf")):
                        raise _Refused(403, "This form is not from your console session (CSRF token missing or "
                                            "wrong). Reload the page and try again.")
                    request.state.form = form
                return await handler(request, seen, seen.principal)
            except _Refused as e:
                return page(request, seen, "error.html", e.status, message=str(e))
            except api.Invalid as e:
                return page(request, seen, "error.html", e.status, message=str(e))
        return ride(answer)

    async def sign_in(request: Request) -> Response:
        seen = await visit(request)
        if request.method == "GET":
            return page(request, seen, "sign_in.html")
        form = await _form(request)
        if seen.fresh or not sessions.csrf_ok(key, seen.session, form.get("csrf")):
            return page(request, seen, "sign_in.html", 403,
                        error="This form is not from your console session (CSRF token missing or wrong). Try again.")
        token = form.get("token", "").strip()
        vouched = await authenticator.vouched(token) if token else None
        if vouched is None:
            return page(request, seen, "sign_in.html", 401, error="That token is not accepted.")
        return await signed_in(request, seen, vouched)

    async def oidc_start(request: Request) -> Response:
        """Off to the issuer, remembering the attempt's state and PKCE verifier in a sealed cookie."""
        seen = await visit(request)
        if not oidc.offered(settings):
            return page(request, seen, "sign_in.html", 404,
                        error="Signing in at an identity provider is not set up here.")
        try:
            endpoint = (await oidc.endpoints(settings))["authorization_endpoint"]
        except oidc.SignInFailed as e:
            return page(request, seen, "sign_in.html", 502, error=str(e))
        attempt = oidc.Attempt.new()
        response = RedirectResponse(oidc.authorization_url(endpoint, settings, attempt, _callback(request)),
                                    status_code=303)
        response.set_cookie(oidc.COOKIE, oidc.seal(key, attempt, time.time()), max_age=oidc.PATIENCE,
                            path=PREFIX, httponly=True, samesite="lax", secure=request.url.scheme == "https")
        return response

    async def oidc_callback(request: Request) -> Response:
        """Back from the issuer: the code is exchanged only for the browser that left (its state)."""
        seen = await visit(request)
        attempt = oidc.unseal(key, request.cookies.get(oidc.COOKIE), time.time())
        code, state = request.query_params.get("code"), request.query_params.get("state")
        if attempt is None or state is None or not hmac.compare_digest(state.encode(), attempt.state.encode()):
            return page(request, seen, "sign_in.html", 403,
                        error="This sign-in was not started from this browser, or took too long. Try again.")
        if not code:
            why = request.query_params.get("error_description") or request.query_params.get("error") or "no code"
            return page(request, seen, "sign_in.html", 401, error=f"The identity provider did not sign you in: {why}")
        try:
            token = await oidc.access_token((await oidc.endpoints(settings))["token_endpoint"], settings, attempt,
                                            code, _callback(request))
        except oidc.SignInFailed as e:
            return page(request, seen, "sign_in.html", 502, error=str(e))
        vouched = await authenticator.vouched(token)
        if vouched is None:
            return page(request, seen, "sign_in.html", 401,
                        error="The identity provider's token is not accepted by this gateway.")
        response = await signed_in(request, seen, vouched)
        response.delete_cookie(oidc.COOKIE, path=PREFIX)
        return response

    async def sign_out(request: Request, seen: Visit, principal: Principal) -> Response:
        """The session ends where it is kept: a copy of its cookie, replayed, is a visitor not signed in."""
        async with engine.begin() as conn:
            await kept_sessions.end(conn, seen.session.id)
        response = RedirectResponse(f"{PREFIX}/sign-in?notice=signed-out", status_code=303)
        _set_cookie(response, request, sessions.seal(key, sessions.new(time.time())))
        return response

    async def search(request: Request, seen: Visit, principal: Principal) -> Response:
        shown = [(k, v) for k, v in request.query_params.multi_items() if v]
        params = api.query(api.RunSearch, QueryParams(shown))
        try:
            async with engine.connect() as conn:
                found = await reads.search_runs(conn, params, principal.tenants)
        except ValueError as e:
            raise _Refused(400, str(e)) from e
        return page(request, seen, "runs.html", runs=found["runs"], filters=params,
                    next_page=_next_page(shown, found["next_cursor"]), statuses=[s.value for s in RunStatus])

    async def load(principal: Principal, run_id: str) -> dict[str, Any]:
        async with engine.connect() as conn:
            view = await reads.run_view(conn, api.path_parameter("run_id", run_id), principal.tenants)
        if view is None:
            raise _Refused(404, f"No run {run_id}.")
        return view

    async def run_page(request: Request, seen: Visit, principal: Principal, *, status: int = 200,
                       error: str | None = None) -> Response:
        view = await load(principal, request.path_params["run_id"])
        snapshot = view["snapshot"]
        wait = snapshot.get("wait")
        return page(request, seen, "run.html", status, error=error, may=console_acts.permitted(principal),
                    owns_wait=wait is None or operate.may_act(principal, from_plain(Wait, wait)),
                    form=request.state.form if status != 200 else {},
                    versions=console_acts.migration_targets(kinds, snapshot["kind"], snapshot["versions"]["workflow"]),
                    signal_names=console_acts.signal_names(kinds, snapshot["kind"], snapshot["versions"]["workflow"]),
                    signal_id=str(uuid.uuid4()), signals=console_acts.received_signals(snapshot),
                    **_run_values(view))

    async def stream(request: Request, seen: Visit, principal: Principal) -> Response:
        return await live.respond(request, engine, hub, principal)

    async def act(request: Request, seen: Visit, principal: Principal) -> Response:
        """A run action of the operator API, as the principal, by the API's use case; a refusal shows the
        run page with why (and the form as it was filled in)."""
        name = request.path_params["action"]
        run_id = request.path_params["run_id"]
        if name not in console_acts.DONE:
            raise _Refused(404, f"No console action {name!r}: {', '.join(console_acts.DONE)}.")
        await load(principal, run_id)  # a run of a tenant not seen is not found, before anything is done
        _may(principal, api.RUN_ACTIONS[name])
        try:
            body = console_acts.body(name, request.state.form)
            async with engine.begin() as conn:
                await run_acts.perform(PgTransaction(conn), run_id, name, body, by=principal, kinds=kinds)
        except api.Invalid as e:
            return await run_page(request, seen, principal, status=e.status, error=str(e))
        except run_acts.REFUSALS as e:
            return await run_page(request, seen, principal, status=run_acts.refusal_status(e), error=str(e))
        return RedirectResponse(f"{PREFIX}/runs/{run_id}?notice={console_acts.DONE[name]}", status_code=303)

    async def quarantine(request: Request, seen: Visit, principal: Principal) -> Response:
        _may(principal, api.BY_ROUTE[("GET", "/quarantine")])
        entries = await quarantine_ops.list_entries(engine, include_replayed=request.query_params.get("all") == "1")
        return page(request, seen, "quarantine.html", entries=entries)

    async def replay(request: Request, seen: Visit, principal: Principal) -> Response:
        _may(principal, api.BY_ROUTE[("POST", "/quarantine/{entry_id}/replay")])
        entry_id = api.path_parameter("entry_id", request.path_params["entry_id"])
        body = _model(api.Replay, reason=request.state.form.get("reason"))
        try:
            await quarantine_ops.replay(engine, bus, entry_id, actor=principal.subject, reason=body.reason,
                                        replay_window=settings.quarantine_replay_window)
        except quarantine_ops.NoSuchEntry as e:
            raise _Refused(404, str(e)) from e
        except quarantine_ops.NotReplayable as e:
            raise _Refused(409, str(e)) from e
        return RedirectResponse(f"{PREFIX}/quarantine?notice=replayed", status_code=303)

    async def audit(request: Request, seen: Visit, principal: Principal) -> Response:
        shown = [(k, v) for k, v in request.query_params.multi_items() if v]
        params = api.query(api.AuditSearch, QueryParams(shown))
        try:
            async with engine.connect() as conn:
                found = await reads.audit_entries(conn, params, tenants=principal.tenants)
        except ValueError as e:
            raise _Refused(400, str(e)) from e
        return page(request, seen, "audit.html", entries=found["entries"], filters=params,
                    next_page=_next_page(shown, found["next_cursor"]))

    async def limits(request: Request, seen: Visit, principal: Principal) -> Response:
        """A tenant's limits (``?tenant_id=``), with the form that changes them for its admins."""
        _may(principal, api.BY_ROUTE[("GET", "/tenants/{tenant_id}/limits")])
        tenant = request.query_params.get("tenant_id", "").strip()
        if not tenant:
            return page(request, seen, "limits.html", view=None)
        view = await _tenant_limits(principal, tenant)
        return page(request, seen, "limits.html", view=view, groups=console_limits.shown_groups(
            view["tool_concurrency"]), may_change=_allowed(principal, api.BY_ROUTE[("PUT", LIMITS)]))

    async def change_limits(request: Request, seen: Visit, principal: Principal) -> Response:
        _may(principal, api.BY_ROUTE[("PUT", LIMITS)])
        tenant = api.path_parameter("tenant_id", request.path_params["tenant_id"])
        await _tenant_limits(principal, tenant)
        body = _model(api.LimitsChange, **console_limits.change(request.state.form))
        asked = TenantLimits(tenant, body.run_slots, body.token_budget, body.cost_budget, body.tool_concurrency)
        try:
            async with engine.begin() as conn:
                await tenant_limits.set_limits(conn, asked, defaults, actor=principal.subject,
                                               every_tenant=principal.tenants is None, reason=body.reason)
        except tenant_limits.BeyondCeiling as e:
            raise _Refused(403, str(e)) from e
        return RedirectResponse(f"{PREFIX}/limits?{urlencode({'tenant_id': tenant, 'notice': 'saved'})}",
                                status_code=303)

    async def _tenant_limits(principal: Principal, tenant: str) -> dict[str, Any]:
        tenant = api.path_parameter("tenant_id", tenant)
        if not principal.sees(tenant):
            raise _Refused(404, f"No tenant {tenant!r} among those {principal.subject} sees.")
        async with engine.connect() as conn:
            return await tenant_limits.view(conn, tenant, defaults)

    async def home(request: Request) -> Response:
        return RedirectResponse(f"{PREFIX}/runs", status_code=303)

    async def not_found(request: Request, e: Exception) -> Response:
        assert isinstance(e, HTTPException)
        return HTMLResponse(_TEMPLATES.get_template("bare_error.html").render(
            root=PREFIX, message=f"{request.method} {request.url.path}: {e.detail}"), status_code=e.status_code)

    return Starlette(routes=[
        Route("/", home, methods=["GET"]),
        Route("/sign-in", ride(sign_in), methods=["GET", "POST"]),
        Route("/oidc/start", ride(oidc_start), methods=["GET"]),
        Route("/oidc/callback", ride(oidc_callback), methods=["GET"]),
        Route("/sign-out", signed(sign_out), methods=["POST"]),
        Route("/runs", signed(search), methods=["GET"]),
        Route("/runs/{run_id}", signed(run_page), methods=["GET"]),
        Route("/runs/{run_id}/stream", signed(stream), methods=["GET"]),
        Route("/runs/{run_id}/{action:str}", signed(act), methods=["POST"]),
        Route("/quarantine", signed(quarantine), methods=["GET"]),
        Route("/quarantine/{entry_id}/replay", signed(replay), methods=["POST"]),
        Route("/audit", signed(audit), methods=["GET"]),
        Route("/limits", signed(limits), methods=["GET"]),
        Route("/tenants/{tenant_id}/limits", signed(change_limits), methods=["POST"]),
        *console_schedules.routes(engine, page, signed, _may, _allowed, _Refused, _model, PREFIX),
    ], exception_handlers={HTTPException: not_found}, middleware=[Middleware(SecurityHeaders)])


def _next_page(shown: list[tuple[str, str]], cursor: str | None) -> str | None:
    """The query string of the page after this one: the same filters, the next cursor."""
    return None if cursor is None else urlencode([(k, v) for k, v in shown if k != "cursor"] + [("cursor", cursor)])


def _callback(request: Request) -> str:
    """Where the issuer sends the browser back: this gateway as the browser reached it."""
    return f"{request.url.scheme}://{request.url.netloc}{PREFIX}/oidc/callback"


def _allowed(principal: Principal, op: api.Operation) -> bool:
    return op.role is not None and principal.may(op.role)


def _may(principal: Principal, op: api.Operation) -> None:
    """The console asks of a principal what the operator API asks for the same operation."""
    if not _allowed(principal, op):
        raise _Refused(403, f"{principal.subject} may not {op.name}: it needs the role {op.role}.")
    if op.every_tenant and principal.tenants is not None:
        raise _Refused(403, f"{principal.subject} may not {op.name}: only a principal of every tenant may.")


def _model(model: type[api.M], **fields: Any) -> api.M:
    try:
        return model.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as e:
        raise _Refused(422, "; ".join(f"{'.'.join(map(str, p['loc'])) or 'form'}: {p['msg']}"
                                      for p in e.errors())) from e


async def _form(request: Request) -> dict[str, str]:
    """A urlencoded form's fields (the console's forms send nothing else); a repeated field's first value."""
    fields = parse_qs((await request.body()).decode(errors="replace"), keep_blank_values=True)
    return {k: v[0] for k, v in fields.items()}


def _set_cookie(response: Response, request: Request, value: str) -> None:
    """The session's cookie: ``__Host-`` and Secure behind TLS (the scheme a trusted proxy forwards,
    ``LONGRUN_FORWARDED_ALLOW_IPS``), else scoped to the console's path."""
    https = request.url.scheme == "https"
    response.set_cookie(sessions.cookie_name(https), value, max_age=sessions.LIFETIME, path="/" if https else PREFIX,
                        httponly=True, samesite="lax", secure=https)


def _run_values(view: dict[str, Any]) -> dict[str, Any]:
    """What the run page shows: the view of ``GET /runs/{id}`` with its events as timeline lines, each
    action's ledger row and receipt (the fact ``receipt:<action>``) beside its summary, the actions in
    doubt and failed, and the question the run waits on."""
    snapshot = view["snapshot"]
    calls = {c["logical_action"]: c for c in view["actions"]}
    receipts = {f["key"].removeprefix(RECEIPT_FACT_PREFIX): f["value"] for f in snapshot["facts"]
                if f["key"].startswith(RECEIPT_FACT_PREFIX)}
    return {
        "view": view, "run": snapshot, "wait": snapshot.get("wait"),
        "live": snapshot["status"] not in {s.value for s in TERMINAL},
        "last_seq": max((e["seq"] for e in view["events"]), default=0),
        "actions": [{**a, "ledger": calls.get(a["logical_action"]), "receipt": receipts.get(a["logical_action"])}
                    for a in snapshot["actions"]],
        "in_doubt": [a["logical_action"] for a in snapshot["actions"]
                     if a["status"] in {s.value for s in UNRECONCILED}],
        "failed": [a for a in snapshot["actions"] if a["status"] == ActionStatus.FAILED.value],
        "question": next((q for q in snapshot["open_questions"]
                          if q["question_id"] == (snapshot.get("wait") or {}).get("question_id")), None),
        "timeline": [timeline.describe(e["seq"], e["type"], {k: v for k, v in e.items()
                                                             if k not in ("type", "seq", "at")},
                                       True, datetime.fromtimestamp(e["at"], UTC)).strip()
                     for e in view["events"]],
    }
