"""A fake code forge with CI (GitHub/GitLab + CI stand-in) for the demo and the fault tests.

Every mutating endpoint honours ``Idempotency-Key``: the same key and body get the
recorded response and create nothing new; the same key with another body is refused
with 422 naming both request hashes. Faults can be injected before the object is
committed (503, nothing created) or after it (held response, or 500), which is exactly
the "timed out after the far side acted" case the reconciler must survive. An outage is a
time-based fault: for its window every call to a repository endpoint is answered 503 and
counted (``/_control/unavailable``, or ``--unavailable-for`` from the start). CI runs
finish after a delay with a scripted outcome and are announced by an HMAC-signed
webhook that may be delivered several times. State lives in SQLite, so a restarted
forge still knows what it created, and ``/_control/effects`` counts the objects each
idempotency key created so a checker can assert that none was created twice.

Run it with ``python -m longrun_dependency_upgrade.forge --port 8081 --state /tmp/forge.sqlite``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

log = logging.getLogger(__name__)

ENDPOINTS = ("branches", "commits", "ci_runs", "merge_requests")
FAULT_MODES = ("timeout_after_commit", "fail_before_commit", "error_500_after_commit")
DEFAULT_FAILURE_LOG = """\
$ make test
collected 42 items
tests/test_payment_client.py::PaymentClientTest::testRefund FAILED
DeprecationWarning: Client.charge is deprecated and was removed in payments-sdk 3.0; \
use Client.create_charge
  File "payments/client.py", line 57, in refund
    return self.client.charge(order.amount, refund=True)
AttributeError: 'Client' object has no attribute 'charge'
FAILED PaymentClientTest.testRefund - AttributeError: Client.charge was removed, \
use Client.create_charge
1 failed, 41 passed
"""
PASSING_LOG = "$ make test\ncollected 42 items\n42 passed\n"
# With no script, a branch's first CI run fails the way the upgrade story needs; later runs pass.
DEFAULT_CI_SCRIPT = [{"status": "failed", "log": DEFAULT_FAILURE_LOG}]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL, repo TEXT NOT NULL, ref TEXT NOT NULL,
    -- not unique by itself: idempotency.key is, and /_control/effects counts these rows to show it
    idempotency_key TEXT NOT NULL,
    body TEXT NOT NULL,
    UNIQUE (kind, repo, ref)
);
CREATE TABLE IF NOT EXISTS idempotency (
    key TEXT PRIMARY KEY, request_hash TEXT NOT NULL, response TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def sign_payload(secret: str, body: bytes) -> str:
    """The ``X-Forge-Signature`` value for a webhook body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _public(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if not k.startswith("_")}


class _Store:
    """The forge's SQLite state; each method is one transaction on the server's loop."""

    def __init__(self, path: str) -> None:
        # Created by whoever builds the app, used from the thread uvicorn serves on.
        self._db = sqlite3.connect(path, check_same_thread=False)
        self._db.executescript(_SCHEMA)

    def get(self, kind: str, repo: str, ref: str) -> dict[str, Any] | None:
        row = self._db.execute(
            "SELECT body FROM objects WHERE kind = ? AND repo = ? AND ref = ?", (kind, repo, ref)
        ).fetchone()
        return json.loads(row[0]) if row else None

    def count(self, kind: str, repo: str | None = None, **fields: str) -> int:
        sql, params = "SELECT count(*) FROM objects WHERE kind = ?", [kind]
        if repo is not None:
            sql, params = sql + " AND repo = ?", [*params, repo]
        for name, value in fields.items():
            sql, params = sql + " AND json_extract(body, ?) = ?", [*params, f"$.{name}", value]
        return self._db.execute(sql, params).fetchone()[0]

    def create(self, created: _Created, key: str, request_hash: str) -> None:
        repo = created.obj["repo"]
        with self._db:
            self._db.execute(
                "INSERT INTO objects (kind, repo, ref, idempotency_key, body) VALUES (?, ?, ?, ?, ?)",
                (created.kind, repo, created.ref, key, json.dumps(created.obj)),
            )
            self._db.execute(
                "INSERT INTO idempotency VALUES (?, ?, ?)",
                (key, request_hash, json.dumps(_public(created.obj))),
            )
            for kind, ref, obj in created.updates:
                self._update(kind, repo, ref, obj)

    def update(self, kind: str, repo: str, ref: str, obj: dict[str, Any]) -> None:
        with self._db:
            self._update(kind, repo, ref, obj)

    def _update(self, kind: str, repo: str, ref: str, obj: dict[str, Any]) -> None:
        self._db.execute(
            "UPDATE objects SET body = ? WHERE kind = ? AND repo = ? AND ref = ?",
            (json.dumps(obj), kind, repo, ref),
        )

    def recorded(self, key: str) -> tuple[str, dict[str, Any]] | None:
        row = self._db.execute(
            "SELECT request_hash, response FROM idempotency WHERE key = ?", (key,)
        ).fetchone()
        return (row[0], json.loads(row[1])) if row else None

    def by_key(self, key: str) -> tuple[str, dict[str, Any]] | None:
        row = self._db.execute(
            "SELECT kind, body FROM objects WHERE idempotency_key = ? ORDER BY seq LIMIT 1", (key,)
        ).fetchone()
        return (row[0], _public(json.loads(row[1]))) if row else None

    def running_runs(self) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT body FROM objects WHERE kind = 'ci_run'"
            " AND json_extract(body, '$.status') = 'running'"
        )
        return [json.loads(body) for (body,) in rows]

    def effects(self) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT kind, idempotency_key, count(*) FROM objects"
            " GROUP BY kind, idempotency_key ORDER BY min(seq)"
        )
        return [{"kind": k, "idempotency_key": key, "count": n} for k, key, n in rows]

    def setting(self, name: str, default: Any = None) -> Any:
        row = self._db.execute("SELECT value FROM settings WHERE name = ?", (name,)).fetchone()
        return json.loads(row[0]) if row else default

    def put_setting(self, name: str, value: Any) -> None:
        with self._db:
            self._db.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", (name, json.dumps(value)))

    def drop_setting(self, name: str) -> None:
        with self._db:
            self._db.execute("DELETE FROM settings WHERE name = ?", (name,))

    def reset(self) -> None:
        with self._db:
            self._db.execute("DELETE FROM objects")
            self._db.execute("DELETE FROM idempotency")
            self._db.execute("DELETE FROM settings")

    def close(self) -> None:
        self._db.close()


class _Created(NamedTuple):
    kind: str
    ref: str
    obj: dict[str, Any]
    updates: tuple[tuple[str, str, dict[str, Any]], ...] = ()


class _Reject(Exception):
    """A definite refusal; the app turns it into a JSON error response."""

    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.body = {"error": code, "detail": detail, **extra}


async def _rejected(request: Request, exc: _Reject) -> JSONResponse:
    return JSONResponse(exc.body, status_code=exc.status)


def _field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    value = body.get(name, default)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _Reject(400, "bad_request", f"field {name!r} is missing or has the wrong type")
    return value


async def _json_object(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError as exc:
        raise _Reject(400, "bad_request", f"body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise _Reject(400, "bad_request", "body must be a JSON object")
    return body


async def _hold(request: Request, seconds: float) -> None:
    """Keep the answer back like a stalled forge, until the client hangs up or time is up."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not await request.is_disconnected():
        await asyncio.sleep(0.05)


_Build = Callable[[Request, str, dict[str, Any]], _Created]


class _Outage:
    """A window during which the forge answers 503 to every repository call, counting them."""

    def __init__(self) -> None:
        self.until = 0.0
        self.calls = 0

    def start(self, seconds: float) -> None:
        self.until, self.calls = time.monotonic() + seconds, 0

    def refuse(self) -> None:
        if time.monotonic() < self.until:
            self.calls += 1
            raise _Reject(503, "unavailable", "the forge is down for maintenance: nothing was done")

    def report(self) -> dict[str, Any]:
        return {"remaining_seconds": max(0.0, self.until - time.monotonic()), "calls": self.calls}


class _Forge:
    """The endpoints, over one store; CI runs finish in tasks on the server's loop."""

    def __init__(self, store: _Store, ci_delay: float) -> None:
        self.store = store
        self.ci_delay = ci_delay
        self.tasks: set[asyncio.Task[None]] = set()
        self.outage = _Outage()

    def mutating(self, endpoint: str, build: _Build) -> Callable[[Request], Awaitable[JSONResponse]]:
        async def handler(request: Request) -> JSONResponse:
            self.outage.refuse()
            return await self._mutate(request, endpoint, build)

        return handler

    async def _mutate(self, request: Request, endpoint: str, build: _Build) -> JSONResponse:
        key = request.headers.get("Idempotency-Key")
        if not key:
            raise _Reject(400, "idempotency_key_required", "send an Idempotency-Key header")
        body = await _json_object(request)
        fault = self._take_fault(endpoint)
        if fault and fault["mode"] == "fail_before_commit":
            raise _Reject(503, "unavailable", "injected fault: nothing was created")
        self._fence(key, request.headers.get("Fencing-Token"))
        request_hash = hashlib.sha256(_canonical([request.method, request.url.path, body])).hexdigest()
        headers = {}
        # No await from this lookup to the insert below: check-and-create is atomic on this loop.
        recorded = self.store.recorded(key)
        if recorded is None:
            response = self._create(build(request, request.path_params["repo"], body), key, request_hash)
        elif recorded[0] == request_hash:
            response, headers = recorded[1], {"Idempotent-Replayed": "true"}
        else:
            raise _Reject(
                422, "idempotency_key_reused",
                f"key {key!r} was used with request hash {recorded[0]}, refusing request hash {request_hash}",
                idempotency_key=key, recorded_request_hash=recorded[0], offered_request_hash=request_hash,
            )
        if fault and fault["mode"] == "timeout_after_commit":
            await _hold(request, fault["hold_seconds"])
        if fault and fault["mode"] == "error_500_after_commit":
            raise _Reject(500, "internal", "injected fault after the object was committed")
        return JSONResponse(response, status_code=201, headers=headers)

    def _fence(self, key: str, header: str | None) -> None:
        """The tool side of fencing: a write under ``key`` whose token is older than the newest one seen
        for it comes from a worker that lost its lease since (its successor wrote already): refused."""
        if header is None:
            return
        try:
            token = int(header)
        except ValueError:
            raise _Reject(400, "bad_fencing_token", f"Fencing-Token must be an integer, got {header!r}") from None
        newest = self.store.setting(f"fence:{key}", 0)
        if token < newest:
            raise _Reject(409, "stale_fencing_token",
                          f"fencing token {token} is older than {newest}, already seen for key {key!r}",
                          idempotency_key=key, fencing_token=token, newest_fencing_token=newest)
        self.store.put_setting(f"fence:{key}", token)

    def _create(self, created: _Created, key: str, request_hash: str) -> dict[str, Any]:
        self.store.create(created, key, request_hash)
        if created.kind == "ci_run":
            self._schedule_finish(created.obj)
        return _public(created.obj)

    def _take_fault(self, endpoint: str) -> dict[str, Any] | None:
        fault = self.store.setting(f"fault:{endpoint}")
        if fault is None:
            return None
        if fault["times"] <= 1:
            self.store.drop_setting(f"fault:{endpoint}")
        else:
            self.store.put_setting(f"fault:{endpoint}", {**fault, "times": fault["times"] - 1})
        return fault

    def _resolve(self, repo: str, ref: str) -> str:
        if branch := self.store.get("branch", repo, ref):
            return branch["head_sha"]
        if self.store.get("commit", repo, ref):
            return ref
        # A base ref the forge never saw (e.g. "main") gets a stable synthetic head.
        return hashlib.sha1(f"{repo}@{ref}".encode()).hexdigest()

    def new_branch(self, request: Request, repo: str, body: dict[str, Any]) -> _Created:
        name, base = _field(body, "name", str), _field(body, "from", str)
        if self.store.get("branch", repo, name):
            raise _Reject(409, "branch_exists", f"branch {name!r} already exists in {repo}")
        head = self._resolve(repo, base)
        return _Created("branch", name, {"repo": repo, "name": name, "from": base, "head_sha": head})

    def new_commit(self, request: Request, repo: str, body: dict[str, Any]) -> _Created:
        name, files = _field(body, "branch", str), _field(body, "files", dict)
        message = _field(body, "message", str)
        if not all(isinstance(v, str) for v in files.values()):
            raise _Reject(400, "bad_request", "files must map paths to text contents")
        branch = self.store.get("branch", repo, name)
        if branch is None:
            raise _Reject(404, "unknown_branch", f"no branch {name!r} in {repo}")
        parent = branch["head_sha"]
        sha = hashlib.sha1(_canonical([repo, name, parent, files, message])).hexdigest()
        commit = {"repo": repo, "sha": sha, "branch": name, "parent": parent, "message": message,
                  "files": files}
        return _Created("commit", sha, commit, (("branch", name, {**branch, "head_sha": sha}),))

    def new_ci_run(self, request: Request, repo: str, body: dict[str, Any]) -> _Created:
        sha = _field(body, "sha", str)
        commit = self.store.get("commit", repo, sha)
        if commit is None:
            raise _Reject(404, "unknown_sha", f"no commit {sha} in {repo}")
        ordinal = self.store.count("ci_run", repo, branch=commit["branch"])
        script = self.store.setting(f"ci_script:{repo}", DEFAULT_CI_SCRIPT)
        plan = script[ordinal] if ordinal < len(script) else {"status": "passed", "log": PASSING_LOG}
        run_id = self.store.count("ci_run") + 1
        run = {"repo": repo, "id": run_id, "sha": sha, "branch": commit["branch"], "status": "running",
               "log": "", "_plan": plan, "_finish_at": time.time() + self.ci_delay}
        return _Created("ci_run", str(run_id), run)

    def new_merge_request(self, request: Request, repo: str, body: dict[str, Any]) -> _Created:
        source, sha = _field(body, "source_branch", str), _field(body, "sha", str)
        title, description = _field(body, "title", str), _field(body, "description", str, "")
        branch = self.store.get("branch", repo, source)
        if branch is None:
            raise _Reject(404, "unknown_branch", f"no branch {source!r} in {repo}")
        if branch["head_sha"] != sha:
            # The approval was for `sha`; a moved branch must not be merged under it.
            raise _Reject(409, "head_moved", f"{source} is at {branch['head_sha']}, not {sha}")
        if self.store.count("merge_request", repo, source_branch=source, state="open"):
            raise _Reject(409, "merge_request_exists", f"an open merge request exists for {source}")
        number = self.store.count("merge_request", repo) + 1
        mr = {"repo": repo, "id": self.store.count("merge_request") + 1, "number": number,
              "url": f"{str(request.base_url).rstrip('/')}/{repo}/merge_requests/{number}",
              "state": "open", "source_branch": source, "title": title, "description": description,
              "sha": sha}
        return _Created("merge_request", str(number), mr)

    async def get_ci_run(self, request: Request) -> JSONResponse:
        self.outage.refuse()
        run_id = request.path_params["run_id"]
        run = self.store.get("ci_run", request.path_params["repo"], str(run_id))
        if run is None:
            raise _Reject(404, "unknown_ci_run", f"no CI run {run_id}")
        return JSONResponse(_public(run))

    async def lookup(self, request: Request) -> JSONResponse:
        self.outage.refuse()
        found = self.store.by_key(request.query_params.get("idempotency_key", ""))
        if found is None:
            raise _Reject(404, "not_found", "nothing was created with that idempotency key")
        return JSONResponse({"kind": found[0], "object": found[1]})

    async def set_fault(self, request: Request) -> JSONResponse:
        body = await _json_object(request)
        endpoint, mode = _field(body, "endpoint", str), _field(body, "mode", str)
        times, hold = _field(body, "times", int, 1), _field(body, "hold_seconds", (int, float), 30.0)
        if endpoint not in ENDPOINTS or mode not in FAULT_MODES or times < 1:
            raise _Reject(400, "bad_request", f"endpoint in {ENDPOINTS}, mode in {FAULT_MODES}, times >= 1")
        fault = {"mode": mode, "times": times, "hold_seconds": float(hold)}
        self.store.put_setting(f"fault:{endpoint}", fault)
        return JSONResponse({"endpoint": endpoint, **fault})

    async def unavailable(self, request: Request) -> JSONResponse:
        """POST ``{"seconds": s}`` starts an outage of ``s`` seconds (its count from zero); GET reports the
        seconds left and the calls refused since it started."""
        if request.method == "POST":
            seconds = _field(await _json_object(request), "seconds", (int, float))
            if seconds < 0:
                raise _Reject(400, "bad_request", f"seconds must be >= 0, got {seconds}")
            self.outage.start(float(seconds))
        return JSONResponse(self.outage.report())

    async def set_webhook(self, request: Request) -> JSONResponse:
        body = await _json_object(request)
        hook = {"url": _field(body, "url", str), "secret": _field(body, "secret", str),
                "deliver_times": _field(body, "deliver_times", int, 1)}
        self.store.put_setting("webhook", hook)
        return JSONResponse({"url": hook["url"], "deliver_times": hook["deliver_times"]})

    async def set_ci_script(self, request: Request) -> JSONResponse:
        body = await _json_object(request)
        repo, runs = _field(body, "repo", str), _field(body, "runs", list)
        if not all(isinstance(r, dict) and r.get("status") in ("failed", "passed") for r in runs):
            raise _Reject(400, "bad_request", 'each run needs "status": "failed" | "passed"')
        default_log = {"failed": DEFAULT_FAILURE_LOG, "passed": PASSING_LOG}
        script = [{"status": r["status"], "log": r.get("log") or default_log[r["status"]]} for r in runs]
        self.store.put_setting(f"ci_script:{repo}", script)
        return JSONResponse({"repo": repo, "runs": script})

    async def effects(self, request: Request) -> JSONResponse:
        return JSONResponse(self.store.effects())

    async def reset(self, request: Request) -> JSONResponse:
        self.cancel_pending()
        self.store.reset()
        return JSONResponse({"reset": True})

    async def healthz(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    def resume_running(self) -> None:
        """Runs that were still going when the forge stopped finish on schedule after a restart."""
        for run in self.store.running_runs():
            self._schedule_finish(run)

    def cancel_pending(self) -> None:
        for task in list(self.tasks):
            task.cancel()

    def _schedule_finish(self, run: dict[str, Any]) -> None:
        finish = self._finish(run["repo"], run["id"], run["_finish_at"])
        task = asyncio.get_running_loop().create_task(finish)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _finish(self, repo: str, run_id: int, finish_at: float) -> None:
        await asyncio.sleep(max(0.0, finish_at - time.time()))
        run = self.store.get("ci_run", repo, str(run_id))
        if run is None or run["status"] != "running":
            return
        plan = run.pop("_plan")
        run.update(status=plan["status"], log=plan["log"])
        self.store.update("ci_run", repo, str(run_id), run)
        await self._deliver({
            "id": f"evt-{uuid.uuid4()}", "type": "ci.finished", "ci_run_id": run_id, "repo": repo,
            "sha": run["sha"], "status": run["status"],
            "log_excerpt": "\n".join(run["log"].splitlines()[-20:])[-2000:],
        })

    async def _deliver(self, event: dict[str, Any]) -> None:
        hook = self.store.setting("webhook")
        if hook is None:
            return
        body = _canonical(event)
        headers = {"Content-Type": "application/json", "X-Forge-Event-Id": event["id"],
                   "X-Forge-Signature": sign_payload(hook["secret"], body)}
        async with httpx.AsyncClient(timeout=5.0) as client:
            # The same event, byte for byte, each time: receivers must dedupe by its id.
            for attempt in range(hook["deliver_times"]):
                try:
                    await client.post(hook["url"], content=body, headers=headers)
                except httpx.HTTPError as exc:
                    log.warning("webhook %s delivery %d to %s failed: %r", event["id"], attempt + 1,
                                hook["url"], exc)


def create_app(state_path: str | None = None, *, ci_delay: float = 0.2, unavailable_for: float = 0.0) -> Starlette:
    """The forge app; ``state_path`` defaults to ``$LONGRUN_FORGE_STATE``, else in-memory;
    ``unavailable_for``: seconds of outage from the start."""
    store = _Store(state_path or os.environ.get("LONGRUN_FORGE_STATE", ":memory:"))
    forge = _Forge(store, ci_delay)
    forge.outage.start(unavailable_for)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        forge.resume_running()
        yield
        forge.cancel_pending()
        store.close()

    repo = "/repos/{repo:path}"
    return Starlette(
        routes=[
            Route(f"{repo}/branches", forge.mutating("branches", forge.new_branch), methods=["POST"]),
            Route(f"{repo}/commits", forge.mutating("commits", forge.new_commit), methods=["POST"]),
            Route(f"{repo}/ci/runs", forge.mutating("ci_runs", forge.new_ci_run), methods=["POST"]),
            Route(f"{repo}/ci/runs/{{run_id:int}}", forge.get_ci_run, methods=["GET"]),
            Route(f"{repo}/merge_requests", forge.mutating("merge_requests", forge.new_merge_request),
                  methods=["POST"]),
            Route("/lookup", forge.lookup, methods=["GET"]),
            Route("/_control/faults", forge.set_fault, methods=["POST"]),
            Route("/_control/unavailable", forge.unavailable, methods=["GET", "POST"]),
            Route("/_control/webhook", forge.set_webhook, methods=["POST"]),
            Route("/_control/ci_script", forge.set_ci_script, methods=["POST"]),
            Route("/_control/effects", forge.effects, methods=["GET"]),
            Route("/_control/reset", forge.reset, methods=["POST"]),
            Route("/healthz", forge.healthz, methods=["GET"]),
        ],
        exception_handlers={_Reject: _rejected},
        lifespan=lifespan,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m longrun_dependency_upgrade.forge", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--state", default=os.environ.get("LONGRUN_FORGE_STATE", ":memory:"),
                        help="SQLite file that keeps the forge's objects across restarts")
    parser.add_argument("--ci-delay", type=float, default=0.2, help="seconds until a CI run finishes")
    parser.add_argument("--unavailable-for", type=float, default=0.0,
                        help="seconds from the start during which every repository call is answered 503")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    uvicorn.run(create_app(args.state, ci_delay=args.ci_delay, unavailable_for=args.unavailable_for),
                host=args.host, port=args.port,
                timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
