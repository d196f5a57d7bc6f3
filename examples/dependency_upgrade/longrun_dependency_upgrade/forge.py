"""A demo code forge with CI (a GitHub/GitLab stand-in over real git repositories) for the demo and tests.

Every mutating endpoint honours ``Idempotency-Key``: the same key and body get the
recorded response and create nothing new; the same key with another body is refused
with 422 naming both request hashes. Faults can be injected before the object is
committed (503, nothing created) or after it (held response, or 500), which is exactly
the "timed out after the far side acted" case the reconciler must survive. An outage is a
time-based fault: for its window every call to a repository endpoint is answered 503 and
counted (``/_control/unavailable``, or ``--unavailable-for`` from the start). Repositories are real git repositories (``repository``): a branch is a ref, a commit writes the
agent's files on the branch's head and answers with its diff, a merge request names a branch at a
sha. A CI run runs the commit's own tests (``ci``), takes at least ``--ci-delay`` seconds, and is
announced by an HMAC-signed webhook that may be delivered several times. State lives in SQLite and
the repositories beside it (``<state>.repos``), so a restarted forge still knows what it created,
and ``/_control/effects`` counts the objects each idempotency key created so a checker can assert
that none was created twice.

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
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from longrun_dependency_upgrade.ci import run_tests
from longrun_dependency_upgrade.forge_store import Created, Store, canonical, public
from longrun_dependency_upgrade.repository import MAIN, BadName, Repositories

log = logging.getLogger(__name__)

ENDPOINTS = ("branches", "commits", "ci_runs", "merge_requests")
FAULT_MODES = ("timeout_after_commit", "fail_before_commit", "error_500_after_commit")


def sign_payload(secret: str, body: bytes) -> str:
    """The ``X-Forge-Signature`` value for a webhook body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


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


_Build = Callable[[Request, str, dict[str, Any]], Created]


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

    def __init__(self, store: Store, repositories: Repositories, ci_delay: float) -> None:
        self.store = store
        self.repositories = repositories
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
        request_hash = hashlib.sha256(canonical([request.method, request.url.path, body])).hexdigest()
        headers = {}
        # No await from this lookup to the insert below: check-and-create is atomic on this loop.
        recorded = self.store.recorded(key)
        if recorded is None:
            try:
                created = build(request, request.path_params["repo"], body)
            except BadName as exc:
                raise _Reject(400, "bad_name", str(exc)) from exc
            response = self._create(created, key, request_hash)
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

    def _create(self, created: Created, key: str, request_hash: str) -> dict[str, Any]:
        self.store.create(created, key, request_hash)
        if created.kind == "ci_run":
            self._schedule_finish(created.obj)
        return public(created.obj)

    def _take_fault(self, endpoint: str) -> dict[str, Any] | None:
        fault = self.store.setting(f"fault:{endpoint}")
        if fault is None:
            return None
        if fault["times"] <= 1:
            self.store.drop_setting(f"fault:{endpoint}")
        else:
            self.store.put_setting(f"fault:{endpoint}", {**fault, "times": fault["times"] - 1})
        return fault

    def new_branch(self, request: Request, repo: str, body: dict[str, Any]) -> Created:
        name, base = _field(body, "name", str), _field(body, "from", str)
        if self.store.get("branch", repo, name):
            raise _Reject(409, "branch_exists", f"branch {name!r} already exists in {repo}")
        head = self.repositories.resolve(repo, base)
        if head is None:
            raise _Reject(404, "unknown_ref", f"no branch or commit {base!r} in {repo}")
        self.repositories.set_branch(repo, name, head)
        return Created("branch", name, {"repo": repo, "name": name, "from": base, "head_sha": head})

    def new_commit(self, request: Request, repo: str, body: dict[str, Any]) -> Created:
        name, files = _field(body, "branch", str), _field(body, "files", dict)
        message = _field(body, "message", str)
        if not all(isinstance(v, str) for v in files.values()):
            raise _Reject(400, "bad_request", "files must map paths to text contents")
        branch = self.store.get("branch", repo, name)
        if branch is None:
            raise _Reject(404, "unknown_branch", f"no branch {name!r} in {repo}")
        parent = branch["head_sha"]
        # The key as a trailer: two runs committing the same files on the same parent get two commits.
        sha = self.repositories.commit(repo, parent, files, f"{message}\n\nIdempotency-Key: "
                                                            f"{request.headers['Idempotency-Key']}\n")
        self.repositories.set_branch(repo, name, sha)
        commit = {"repo": repo, "sha": sha, "branch": name, "parent": parent, "message": message,
                  "files": files, "diff": self.repositories.diff(repo, parent, sha)}
        return Created("commit", sha, commit, (("branch", name, {**branch, "head_sha": sha}),))

    def new_ci_run(self, request: Request, repo: str, body: dict[str, Any]) -> Created:
        sha = _field(body, "sha", str)
        commit = self.store.get("commit", repo, sha)
        if commit is None:
            raise _Reject(404, "unknown_sha", f"no commit {sha} in {repo}")
        run_id = self.store.count("ci_run") + 1
        run = {"repo": repo, "id": run_id, "sha": sha, "branch": commit["branch"], "status": "running",
               "log": "", "summary": "", "_finish_at": time.time() + self.ci_delay}
        return Created("ci_run", str(run_id), run)

    def new_merge_request(self, request: Request, repo: str, body: dict[str, Any]) -> Created:
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
              "state": "open", "source_branch": source, "target_branch": MAIN, "title": title,
              "description": description, "sha": sha}
        return Created("merge_request", str(number), mr)

    async def get_ci_run(self, request: Request) -> JSONResponse:
        self.outage.refuse()
        run_id = request.path_params["run_id"]
        run = self.store.get("ci_run", request.path_params["repo"], str(run_id))
        if run is None:
            raise _Reject(404, "unknown_ci_run", f"no CI run {run_id}")
        return JSONResponse(public(run))

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

    async def effects(self, request: Request) -> JSONResponse:
        return JSONResponse(self.store.effects())

    async def reset(self, request: Request) -> JSONResponse:
        self.cancel_pending()
        self.store.reset()
        self.repositories.reset()
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
        finish = self._finish(run["repo"], run["id"], run["sha"], run["_finish_at"])
        task = asyncio.get_running_loop().create_task(finish)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _finish(self, repo: str, run_id: int, sha: str, finish_at: float) -> None:
        outcome = await asyncio.to_thread(run_tests, self.repositories, repo, sha)
        await asyncio.sleep(max(0.0, finish_at - time.time()))
        run = self.store.get("ci_run", repo, str(run_id))
        if run is None or run["status"] != "running":
            return
        run.update(status=outcome.status, summary=outcome.summary, log=outcome.log)
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
        body = canonical(event)
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
    """The forge app; ``state_path`` defaults to ``$LONGRUN_FORGE_STATE``, else in-memory, the git
    repositories in ``<state_path>.repos`` (in-memory: a temporary directory removed at shutdown);
    ``unavailable_for``: seconds of outage from the start."""
    state = state_path or os.environ.get("LONGRUN_FORGE_STATE", ":memory:")
    transient = state == ":memory:"
    repositories = Repositories(Path(tempfile.mkdtemp(prefix="forge-repos-") if transient else f"{state}.repos"))
    store = Store(state)
    forge = _Forge(store, repositories, ci_delay)
    forge.outage.start(unavailable_for)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        forge.resume_running()
        yield
        forge.cancel_pending()
        store.close()
        if transient:
            shutil.rmtree(repositories.root, ignore_errors=True)

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
                        help="SQLite file that keeps the forge's objects across restarts; the git "
                             "repositories are kept beside it, in <state>.repos")
    parser.add_argument("--ci-delay", type=float, default=0.2, help="seconds a CI run takes at least (its tests run meanwhile)")
    parser.add_argument("--unavailable-for", type=float, default=0.0,
                        help="seconds from the start during which every repository call is answered 503")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    uvicorn.run(create_app(args.state, ci_delay=args.ci_delay, unavailable_for=args.unavailable_for),
                host=args.host, port=args.port,
                timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
