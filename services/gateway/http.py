"""The gateway's HTTP routes: webhooks (HMAC, dedup, fast 2xx) and the authenticated operator API, whose
requests are checked against its contract (``services.gateway.api``, served at ``GET /openapi.json``)."""

from __future__ import annotations

import functools
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel
from sqlalchemy import exists, select, text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from longrun import artifacts, run_kinds, webhook_providers
from longrun.artifacts import FilesystemArtifactStore
from longrun.app import operate, webhooks
from longrun.app import quarantine as quarantine_ops
from longrun.app import versions
from longrun.app.reconcile_alerts import ALERT_PREFIX
from longrun.app.transaction import PgTransaction
from longrun.authoring import Registry
from longrun.bus.connection import Bus
from longrun.config import Settings
from longrun.app.retention import ARCHIVE_MEDIA_TYPE
from longrun.db import actions as ledger
from longrun.db import pages, policies, retention, runs
from longrun.db.errors import is_transient
from longrun.db.schema import artifacts as artifacts_table
from longrun.db.schema import audit_log, run_labels
from longrun.db.schema import runs as runs_table
from longrun.domain import RunSnapshot, Scope, TenantPolicy, event_to_dict
from longrun.errors import DomainError, LongrunError
from services.gateway import api, openapi

logger = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Response]]
ATTEMPTS = 4
"""Attempts of one request when the database connection breaks under it (0.1, 0.2, 0.4 s apart)."""


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


def create_app(engine: AsyncEngine, bus: Bus, settings: Settings) -> Starlette:
    kinds = run_kinds.load(settings)  # a run terminated here shows its tools' public receipt fields
    providers = webhook_providers.load(settings)
    store = FilesystemArtifactStore(settings.artifact_dir)

    async def webhook(request: Request) -> Response:
        provider = request.path_params["provider"]
        body = await request.body()
        if provider not in providers:
            return JSONResponse({"error": f"unknown provider {provider!r}"}, status_code=404)
        why = webhooks.refusal(providers[provider].signature, settings.webhook_secret, request.headers, body,
                               now=time.time(), replay_window=settings.webhook_replay_window)
        if why is not None:
            async with engine.begin() as conn:
                await webhooks.audit(conn, actor=f"webhook:{provider}", action="webhook.refused", target=provider,
                                     reason=why, details={"client": request.client.host if request.client else None})
            return JSONResponse({"error": f"refused: {why}"}, status_code=401)
        try:
            payload = webhooks.parse(body)
            async with engine.begin() as conn:
                outcome = await webhooks.receive(PgTransaction(conn), provider, payload, providers=providers)
        except (ValueError, KeyError, json.JSONDecodeError) as e:
            return JSONResponse({"error": f"malformed event: {e}"}, status_code=400)
        return JSONResponse(outcome, status_code=202)

    def operator(request: Request) -> str | None:
        header = request.headers.get("authorization", "")
        token = header.removeprefix("Bearer ").strip()
        if not any(hmac.compare_digest(token, t) for t in settings.operator_tokens):
            return None
        return request.headers.get("x-operator") or "operator"

    async def act(request: Request) -> Response:
        actor = operator(request)
        if actor is None:
            return JSONResponse({"error": "missing or bad bearer token"}, status_code=401)
        name = request.path_params["action"]
        if name not in api.RUN_ACTIONS:
            return JSONResponse({"error": f"no operation {name!r} on a run; one of {', '.join(api.RUN_ACTIONS)}"},
                                status_code=404)
        run_id = api.path_parameter("run_id", request.path_params["run_id"])
        body = api.body(api.RUN_ACTIONS[name], await request.body())
        try:
            async with engine.begin() as conn:
                result = await _act(PgTransaction(conn), run_id, name, body, actor=actor, kinds=kinds)
        except operate.RunNotFound as e:
            return JSONResponse({"error": str(e)}, status_code=404)
        except operate.NotPermitted as e:
            return JSONResponse({"error": str(e)}, status_code=403)
        except operate.AnswerRefused as e:
            return JSONResponse({"error": str(e), "problems": e.problems}, status_code=422)
        except operate.ResolutionRefused as e:
            return JSONResponse({"error": str(e)}, status_code=422)
        except (DomainError, LongrunError) as e:
            return JSONResponse({"error": str(e)}, status_code=409)
        return JSONResponse(result)

    async def show(request: Request) -> Response:
        if operator(request) is None:
            return JSONResponse({"error": "missing or bad bearer token"}, status_code=401)
        run_id = api.path_parameter("run_id", request.path_params["run_id"])
        async with engine.connect() as conn:
            stored = await runs.load(conn, run_id)
            if stored is None:
                return JSONResponse({"error": "no such run"}, status_code=404)
            history = await runs.history(conn, stored.snapshot.run_id)
            needs = (await conn.execute(select(runs_table.c.awaiting_worker).where(
                runs_table.c.run_id == stored.snapshot.run_id))).scalar()
            archived = await retention.archive_of(conn, stored.snapshot.run_id)
            next_timer = (await conn.execute(_NEXT_TIMER, {"r": stored.snapshot.run_id})).first()
            calls = await ledger.for_run(conn, stored.snapshot.run_id)
        # An archived run's events and actions were pruned: the answer says where they went.
        return JSONResponse({"snapshot": stored.snapshot.to_dict(),
                             "actions": [_call(row) for row in calls],
                             "lease": None if stored.lease_owner is None else {
                                 "owner": stored.lease_owner, "fencing_token": stored.fencing_token,
                                 "until": stored.lease_until.isoformat() if stored.lease_until else None},
                             "next_timer": None if next_timer is None else {
                                 "kind": next_timer.kind, "wake_at": next_timer.wake_at.isoformat()},
                             "allowed_operations": operate.allowed_operations(stored.snapshot),
                             "waiting_for": f"a compatible worker: {needs}" if needs else None,
                             "archived": None if archived is None else {
                                 "at": archived.at.isoformat(), "archive": archived.archive,
                                 "location": archived.location, "media_type": ARCHIVE_MEDIA_TYPE},
                             "events": [event_to_dict(e) for e in history]})

    async def attach(request: Request) -> Response:
        """POST the artifact's bytes (``Content-Type``: its media type) with ``?name=...&reason=...``."""
        actor = operator(request)
        if actor is None:
            return JSONResponse({"error": "missing or bad bearer token"}, status_code=401)
        run_id = api.path_parameter("run_id", request.path_params["run_id"])
        params = api.query(api.Attachment, request.query_params)
        data = await request.body()
        if not data or len(data) > settings.max_attachment_bytes:
            return JSONResponse({"error": f"an artifact is 1 to {settings.max_attachment_bytes} bytes "
                                          f"(LONGRUN_MAX_ATTACHMENT_BYTES), got {len(data)}"}, status_code=413)
        media_type = request.headers.get("content-type", "application/octet-stream")
        content_hash = await store.put(data)  # uploaded before the transaction that refers to it
        try:
            async with engine.begin() as conn:
                result = await operate.attach_artifact(
                    PgTransaction(conn), run_id, name=params.name, content_hash=content_hash, size=len(data),
                    media_type=media_type, actor=actor, reason=params.reason)
                await artifacts.register(conn, store, content_hash, size=len(data), media_type=media_type,
                                         run_id=run_id)
        except operate.RunNotFound as e:
            return JSONResponse({"error": str(e)}, status_code=404)
        except operate.AttachmentRefused as e:
            return JSONResponse({"error": str(e)}, status_code=422)
        return JSONResponse(result)

    async def artifact(request: Request) -> Response:
        """An artifact of the run: one attached to it, or a receipt its actions refer to."""
        if operator(request) is None:
            return JSONResponse({"error": "missing or bad bearer token"}, status_code=401)
        run_id = api.path_parameter("run_id", request.path_params["run_id"])
        content_hash = api.path_parameter("content_hash", request.path_params["content_hash"])
        async with engine.connect() as conn:
            stored = await runs.load(conn, run_id)
            row = (await conn.execute(select(artifacts_table.c.media_type).where(
                artifacts_table.c.content_hash == content_hash))).first()
        if stored is None or row is None or not _refers_to(stored.snapshot, content_hash):
            return JSONResponse({"error": f"run {run_id} has no artifact {content_hash}"}, status_code=404)
        return Response(await store.get(content_hash), media_type=row.media_type)

    async def search(request: Request) -> Response:
        """Runs matching every filter given, newest first, a page at a time: ``limit``
        (default 50, at most 500) and the ``next_cursor`` of the page before (None on the last page)."""
        if operator(request) is None:
            return JSONResponse({"error": "missing or bad bearer token"}, status_code=401)
        params = api.query(api.RunSearch, request.query_params)
        query = select(runs_table.c.run_id, runs_table.c.tenant_id, runs_table.c.status, runs_table.c.workflow,
                       runs_table.c.workflow_version, runs_table.c.wait_kind, runs_table.c.awaiting_worker,
                       runs_table.c.idempotency_key, runs_table.c.created_at,
                       runs_table.c.snapshot["labels"].label("labels"), runs_table.c.updated_at)
        for column in ("tenant_id", "status", "wait_kind", "workflow_version", "idempotency_key"):
            if getattr(params, column):
                query = query.where(runs_table.c[column] == getattr(params, column))
        for label in params.label:
            key, _, value = label.partition("=")
            query = query.where(exists().where(run_labels.c.run_id == runs_table.c.run_id,
                                               run_labels.c.key == key, run_labels.c.value == value))
        limit = params.limit or pages.DEFAULT_LIMIT
        try:
            # Age: created more than a duration ago (older_than), or unchanged for one (idle_for).
            for name, column in (("older_than", runs_table.c.created_at), ("idle_for", runs_table.c.updated_at)):
                if getattr(params, name):
                    query = query.where(pages.older_than(name, getattr(params, name), column))
            if params.cursor:
                query = query.where(pages.after(params.cursor, runs_table.c.created_at, runs_table.c.run_id))
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        async with engine.connect() as conn:
            rows = (await conn.execute(query.order_by(runs_table.c.created_at.desc(), runs_table.c.run_id.desc())
                                       .limit(limit + 1))).all()
        page = rows[:limit]
        return JSONResponse({
            "runs": [{**r._mapping, "labels": r.labels or {}, "created_at": r.created_at.isoformat(),
                      "updated_at": r.updated_at.isoformat()} for r in page],
            "next_cursor": pages.cursor(page[-1].created_at, page[-1].run_id) if len(rows) > limit else None})

    async def audit_trail(request: Request) -> Response:
        """The audit log, newest first, a page at a time (as ``search``), filtered by ``actor``,
        ``action``, ``target``; ``/alerts`` is the part of it the reconciler raised (``alert.*``)."""
        if operator(request) is None:
            return JSONResponse({"error": "missing or bad bearer token"}, status_code=401)
        params = api.query(api.AuditSearch, request.query_params)
        query = select(audit_log)
        for column in ("actor", "action", "target"):
            if getattr(params, column):
                query = query.where(audit_log.c[column] == getattr(params, column))
        if request.url.path == "/alerts":
            query = query.where(audit_log.c.action.startswith(ALERT_PREFIX))
        limit = params.limit or pages.DEFAULT_LIMIT
        try:
            if params.cursor:
                query = query.where(pages.after(params.cursor, audit_log.c.at, audit_log.c.id))
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        async with engine.connect() as conn:
            rows = (await conn.execute(query.order_by(audit_log.c.at.desc(), audit_log.c.id.desc())
                                       .limit(limit + 1))).all()
        page = rows[:limit]
        return JSONResponse({
            "entries": [{**r._mapping, "at": r.at.isoformat()} for r in page],
            "next_cursor": pages.cursor(page[-1].at, page[-1].id) if len(rows) > limit else None})

    async def versions_in_use(request: Request) -> Response:
        if operator(request) is None:
            return JSONResponse({"error": "missing or bad bearer token"}, status_code=401)
        async with engine.connect() as conn:
            return JSONResponse(await versions.report(conn))

    async def quarantined(request: Request) -> Response:
        if operator(request) is None:
            return JSONResponse({"error": "missing or bad bearer token"}, status_code=401)
        params = api.query(api.QuarantineListing, request.query_params)
        return JSONResponse(await quarantine_ops.list_entries(engine, include_replayed=params.all == "1"))

    async def replay(request: Request) -> Response:
        actor = operator(request)
        if actor is None:
            return JSONResponse({"error": "missing or bad bearer token"}, status_code=401)
        entry_id = api.path_parameter("entry_id", request.path_params["entry_id"])
        body = api.body(api.Replay, await request.body())
        try:
            result = await quarantine_ops.replay(engine, bus, entry_id, actor=actor, reason=body.reason,
                                                 replay_window=settings.quarantine_replay_window)
        except quarantine_ops.NotReplayable as e:
            return JSONResponse({"error": str(e)}, status_code=409)
        return JSONResponse(result)

    async def tenant_policy(request: Request) -> Response:
        """GET: the tenant's policy; PUT ``{"tools": [...], "resources": [...], "reason"}``: replace it
        (audited), under the next version. Runs created from then on are narrowed by it; approved calls
        of runs created before are re-validated under it."""
        actor = operator(request)
        if actor is None:
            return JSONResponse({"error": "missing or bad bearer token"}, status_code=401)
        tenant = api.path_parameter("tenant_id", request.path_params["tenant_id"])
        if request.method == "GET":
            async with engine.connect() as conn:
                policy = await policies.load(conn, tenant)
            if policy is None:
                return JSONResponse({"error": f"tenant {tenant!r} has no policy: its runs may do what their "
                                              "kind allows"}, status_code=404)
            return JSONResponse(_policy_json(policy))
        body = api.body(api.PolicyChange, await request.body())
        try:
            scope = Scope(tuple(body.tools), tuple(body.resources))
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=422)
        async with engine.begin() as conn:
            policy = await policies.put(conn, tenant, scope, by=actor)
            await webhooks.audit(conn, actor=actor, action="tenant_policy.set", target=tenant, reason=body.reason,
                                 details=_policy_json(policy))
        return JSONResponse(_policy_json(policy))

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    contract = openapi.document()

    async def described(request: Request) -> Response:
        return JSONResponse(contract)

    ride = riding_out_database_restarts
    return Starlette(routes=[
        Route("/webhooks/{provider}", ride(webhook), methods=["POST"]),
        Route("/runs", ride(search), methods=["GET"]),
        Route("/runs/{run_id}", ride(show), methods=["GET"]),
        Route("/runs/{run_id}/artifacts", ride(attach), methods=["POST"]),
        Route("/runs/{run_id}/artifacts/{content_hash}", ride(artifact), methods=["GET"]),
        Route("/runs/{run_id}/{action}", ride(act), methods=["POST"]),
        Route("/versions", ride(versions_in_use), methods=["GET"]),
        Route("/audit", ride(audit_trail), methods=["GET"]),
        Route("/alerts", ride(audit_trail), methods=["GET"]),
        Route("/quarantine", ride(quarantined), methods=["GET"]),
        Route("/quarantine/{entry_id}/replay", ride(replay), methods=["POST"]),
        Route("/tenants/{tenant_id}/policy", ride(tenant_policy), methods=["GET", "PUT"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/openapi.json", described, methods=["GET"]),
    ], exception_handlers={HTTPException: _http_error, api.Invalid: _invalid})


async def _invalid(request: Request, e: Exception) -> Response:
    """A request outside the contract (``services.gateway.api``), refused naming every problem."""
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


def _policy_json(policy: TenantPolicy) -> dict[str, Any]:
    return {"tenant_id": policy.tenant_id, "version": policy.version, "tools": list(policy.scope.tools),
            "resources": list(policy.scope.resources)}


_NEXT_TIMER = text("SELECT kind, wake_at FROM timers WHERE run_id = :r AND fired_at IS NULL AND cancelled_at IS NULL "
                   "ORDER BY wake_at LIMIT 1")
_STEERS = {"cancel": operate.cancel, "pause": operate.pause, "resume": operate.resume}


async def _act(tx: PgTransaction, run_id: str, name: str, body: BaseModel, *, actor: str,
               kinds: Registry) -> dict[str, Any]:
    """The operation ``name`` on a run, with its body as the contract took it."""
    if isinstance(body, api.Decide):
        return await operate.decide_approval(tx, run_id, approval_id=body.approval_id,
                                             approved_hash=body.approved_hash, approved=name == "approve",
                                             actor=actor, reason=body.reason)
    if isinstance(body, api.Answer):
        return await operate.answer(tx, run_id, question_id=body.question_id, answer=body.answer, actor=actor,
                                    reason=body.reason)
    if isinstance(body, api.Resolve):
        return await operate.resolve_action(tx, run_id, logical_action=body.logical_action,
                                            done=body.outcome == "confirmed", external_id=body.external_id,
                                            receipt=body.receipt, actor=actor, reason=body.reason)
    if isinstance(body, api.RetryAction):
        return await operate.retry_action(tx, run_id, logical_action=body.logical_action, actor=actor,
                                          reason=body.reason)
    if isinstance(body, api.Migrate):
        return await operate.migrate(tx, run_id, to_version=body.to_version, actor=actor, reason=body.reason,
                                     kinds=kinds)
    assert isinstance(body, api.Steer)
    if name == "terminate":
        return await operate.terminate(tx, run_id, actor=actor, reason=body.reason, kinds=kinds)
    return await _STEERS[name](tx, run_id, actor=actor, reason=body.reason)


def _call(row: ledger.LedgerRow) -> dict[str, Any]:
    """A ledger row as ``GET /runs/{id}`` shows it: the call, its status and attempts, and what its
    heartbeats last reported (``progress``, recorded at ``heartbeat_at``)."""
    return {"logical_action": row.logical_action, "tool": row.tool, "effect_kind": row.effect_kind,
            "status": row.status, "attempts": row.attempts, "external_id": row.external_id,
            "progress": row.progress,
            "heartbeat_at": None if row.heartbeat_at is None else row.heartbeat_at.isoformat()}
