"""The runtime's HTTP client for the demo forge, with honest failure classes.

How a call fails decides what the action ledger may do next, so this client maps
transport outcomes carefully:

* never connected (connect error/timeout, pool timeout) or a 503: the forge did not act,
  ``ToolUnavailable`` (transient, safe to retry with the same key);
* a write whose request may have reached the forge and then timed out, dropped, or got
  a 5xx other than 503: ``ActionOutcomeUnknown`` (reconcile by idempotency key, never
  treat as failed, never retry blindly);
* a 4xx: ``ToolRejected`` (definite; the same key with another body is
  ``IdempotencyKeyReused``).

Reads have no effect to be unsure about, so their transport failures are ``ToolUnavailable``.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Literal, TypedDict, cast

import httpx

from longrun.errors import ActionOutcomeUnknown, IdempotencyKeyReused, ToolRejected, ToolUnavailable

Endpoint = Literal["branches", "commits", "ci_runs", "merge_requests"]
FaultMode = Literal["timeout_after_commit", "fail_before_commit", "error_500_after_commit"]

# Failures that prove the request never left this process.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class Branch(TypedDict):
    repo: str
    name: str
    head_sha: str


class FileChange(TypedDict):
    path: str
    added: int
    removed: int


class Diff(TypedDict):
    files: list[FileChange]
    added: int
    removed: int


class Commit(TypedDict):
    repo: str
    sha: str
    branch: str
    parent: str
    message: str
    diff: Diff


class CiRun(TypedDict):
    repo: str
    id: int
    sha: str
    branch: str
    status: Literal["running", "failed", "passed"]
    summary: str
    log: str


class MergeRequest(TypedDict):
    repo: str
    id: int
    number: int
    url: str
    state: str
    source_branch: str
    target_branch: str
    sha: str


class LookupResult(TypedDict):
    kind: Literal["branch", "commit", "ci_run", "merge_request"]
    object: dict[str, Any]


class Effect(TypedDict):
    kind: str
    idempotency_key: str
    count: int


class ForgeClient:
    """Typed async calls to the forge; every write carries the caller's idempotency key."""

    def __init__(self, base_url: str, *, timeout: float = 10.0) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout)

    async def __aenter__(self) -> ForgeClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def create_branch(self, repo: str, *, name: str, from_ref: str, idempotency_key: str,
                            fencing_token: int | None = None) -> Branch:
        body = {"name": name, "from": from_ref}
        return cast(Branch, await self._write("forge.create_branch", f"/repos/{repo}/branches",
                                              body, idempotency_key, fencing_token))

    async def create_commit(
        self, repo: str, *, branch: str, files: dict[str, str], message: str, idempotency_key: str,
        fencing_token: int | None = None,
    ) -> Commit:
        body = {"branch": branch, "files": files, "message": message}
        return cast(Commit, await self._write("forge.create_commit", f"/repos/{repo}/commits",
                                              body, idempotency_key, fencing_token))

    async def start_ci_run(self, repo: str, *, sha: str, idempotency_key: str,
                           fencing_token: int | None = None) -> CiRun:
        return cast(CiRun, await self._write("forge.start_ci_run", f"/repos/{repo}/ci/runs",
                                             {"sha": sha}, idempotency_key, fencing_token))

    async def get_ci_run(self, repo: str, run_id: int) -> CiRun:
        return cast(CiRun, await self._read("forge.get_ci_run", f"/repos/{repo}/ci/runs/{run_id}"))

    async def create_merge_request(
        self, repo: str, *, source_branch: str, title: str, description: str, sha: str,
        idempotency_key: str, fencing_token: int | None = None,
    ) -> MergeRequest:
        body = {"source_branch": source_branch, "title": title, "description": description, "sha": sha}
        return cast(MergeRequest, await self._write("forge.create_merge_request",
                                                    f"/repos/{repo}/merge_requests", body, idempotency_key,
                                                    fencing_token))

    async def lookup(self, idempotency_key: str) -> LookupResult | None:
        """What ``idempotency_key`` created, or None: the reconciler's query."""
        try:
            found = await self._read("forge.lookup", "/lookup", params={"idempotency_key": idempotency_key})
        except ToolRejected as exc:
            if exc.status == 404:
                return None
            raise
        return cast(LookupResult, found)

    # Control endpoints: only the demo and the fault tests call these.

    async def set_fault(
        self, endpoint: Endpoint, mode: FaultMode, *, times: int = 1, hold_seconds: float = 30.0
    ) -> None:
        body = {"endpoint": endpoint, "mode": mode, "times": times, "hold_seconds": hold_seconds}
        await self._control("/_control/faults", body)

    async def set_unavailable(self, seconds: float) -> None:
        """Every repository call is answered 503 for ``seconds`` from now (counted: ``unavailable``)."""
        await self._control("/_control/unavailable", {"seconds": seconds})

    async def unavailable(self) -> dict[str, Any]:
        """The outage's seconds left and the calls it refused."""
        return cast(dict[str, Any], await self._read("forge.control", "/_control/unavailable"))

    async def set_webhook(self, url: str, secret: str, *, deliver_times: int = 1) -> None:
        body = {"url": url, "secret": secret, "deliver_times": deliver_times}
        await self._control("/_control/webhook", body)

    async def effects(self) -> list[Effect]:
        return cast(list[Effect], await self._read("forge.effects", "/_control/effects"))

    async def reset(self) -> None:
        await self._control("/_control/reset", {})

    async def _write(self, tool: str, path: str, body: dict[str, Any], idempotency_key: str,
                     fencing_token: int | None) -> Any:
        """``fencing_token``: the caller's lease, sent so the forge refuses a write older than one it saw."""
        headers = {"Idempotency-Key": idempotency_key}
        if fencing_token is not None:
            headers["Fencing-Token"] = str(fencing_token)
        try:
            response = await self._http.post(path, json=body, headers=headers)
        except _NOT_SENT as exc:
            raise ToolUnavailable(tool, f"request never reached the forge: {exc!r}") from exc
        except httpx.TransportError as exc:
            raise ActionOutcomeUnknown(tool, idempotency_key, f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500 and response.status_code != 503:
            # A 500 says nothing about whether the object was committed first.
            raise ActionOutcomeUnknown(tool, idempotency_key, f"HTTP {response.status_code}: {response.text}")
        return _checked(tool, response, idempotency_key)

    async def _read(self, tool: str, path: str, params: dict[str, str] | None = None) -> Any:
        try:
            response = await self._http.get(path, params=params)
        except httpx.TransportError as exc:
            raise ToolUnavailable(tool, f"{type(exc).__name__}: {exc}") from exc
        return _checked(tool, response)

    async def _control(self, path: str, body: dict[str, Any]) -> None:
        try:
            response = await self._http.post(path, json=body)
        except httpx.TransportError as exc:
            raise ToolUnavailable("forge.control", f"{type(exc).__name__}: {exc}") from exc
        _checked("forge.control", response)


def _checked(tool: str, response: httpx.Response, idempotency_key: str | None = None) -> Any:
    if response.is_success:
        return response.json()
    if response.status_code >= 500:
        raise ToolUnavailable(tool, f"HTTP {response.status_code}: {response.text}")
    detail = _json_or_text(response)
    if response.status_code == 422 and detail.get("error") == "idempotency_key_reused":
        raise IdempotencyKeyReused(
            idempotency_key or "", detail["recorded_request_hash"], detail["offered_request_hash"]
        )
    raise ToolRejected(tool, response.status_code, str(detail.get("detail", detail)))


def _json_or_text(response: httpx.Response) -> dict[str, Any]:
    try:
        parsed = response.json()
    except ValueError:
        return {"detail": response.text}
    return parsed if isinstance(parsed, dict) else {"detail": parsed}
