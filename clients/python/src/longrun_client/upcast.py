"""Pure upcasters: payload dict of version n -> version n+1, applied in a loop.

Named ``upcast_<type>_v<n>_v<n+1>`` (dots in the type become underscores). Each has a
golden test in tests/unit/envelope.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


def upcast_run_create_v1_v2(payload: dict[str, Any]) -> dict[str, Any]:
    """v1's single cost ceiling becomes v2's budget; call limits take v2's defaults."""
    out = {k: v for k, v in payload.items() if k != "budget_usd"}
    out["budget"] = {"cost_usd": payload.get("budget_usd", 10.0)}
    return out


def upcast_run_create_v2_v3(payload: dict[str, Any]) -> dict[str, Any]:
    """v2 could not narrow the run's scope nor set a deadline: neither is asked for."""
    return {**payload, "scope": None, "deadline": None}


def upcast_run_create_v3_v4(payload: dict[str, Any]) -> dict[str, Any]:
    """v3 could not set timeouts: the run takes its kind's defaults."""
    return {**payload, "timeouts": None}


def upcast_run_accepted_v1_v2(payload: dict[str, Any]) -> dict[str, Any]:
    """v1 never carried an outcome: a v1 repeat's run is not known to have ended."""
    return {**payload, "outcome": None}


def upcast_run_event_v1_v2(payload: dict[str, Any]) -> dict[str, Any]:
    """v1 carried no labels and no outcome: none are known."""
    return {**payload, "labels": {}, "outcome": None}


def upcast_run_event_v2_v3(payload: dict[str, Any]) -> dict[str, Any]:
    """v2's outcome had no summary: none is known (v3 allows null)."""
    return dict(payload)


def upcast_run_rejected_v1_v2(payload: dict[str, Any]) -> dict[str, Any]:
    """v1 had no code: it refused an unknown workflow or a reused key, told apart by the hashes it named."""
    reused = payload.get("recorded_input_hash") is not None
    return {**payload, "code": "idempotency_key_reused" if reused else "unknown_workflow"}


def upcast_run_rejected_v2_v3(payload: dict[str, Any]) -> dict[str, Any]:
    """v2's closed list of codes is a subset of v3's open ones: the payload is the same."""
    return dict(payload)


UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("run.create", 1): upcast_run_create_v1_v2,
    ("run.create", 2): upcast_run_create_v2_v3,
    ("run.create", 3): upcast_run_create_v3_v4,
    ("run.accepted", 1): upcast_run_accepted_v1_v2,
    ("run.event", 1): upcast_run_event_v1_v2,
    ("run.event", 2): upcast_run_event_v2_v3,
    ("run.rejected", 1): upcast_run_rejected_v1_v2,
    ("run.rejected", 2): upcast_run_rejected_v2_v3,
}


def upcast(type_: str, version: int, payload: dict[str, Any], target: int) -> dict[str, Any]:
    """Apply the chain from ``version`` to ``target``; a missing link is a KeyError."""
    while version < target:
        payload = UPCASTERS[(type_, version)](payload)
        version += 1
    return payload
