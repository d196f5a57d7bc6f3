"""The console's form of a tenant's limits, read into the operator API's body (``api.LimitsChange``):
a blank number is the platform's default; tool groups are written ``group=N``, comma-separated."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def change(form: Mapping[str, str]) -> dict[str, Any]:
    """The fields of ``api.LimitsChange`` the form holds (a value it cannot read is left as typed, for
    the model to refuse naming it)."""
    fields: dict[str, Any] = {name: form.get(name, "").strip() or None
                              for name in ("run_slots", "token_budget", "cost_budget")}
    groups: dict[str, Any] = {}
    for pair in filter(None, (p.strip() for p in form.get("tool_concurrency", "").split(","))):
        group, _, bound = pair.rpartition("=")
        groups[group.strip() or pair] = bound.strip()
    return {**fields, "tool_concurrency": groups, "reason": form.get("reason")}


def shown_groups(groups: Mapping[str, int]) -> str:
    """Tool groups as the form writes them."""
    return ", ".join(f"{group}={bound}" for group, bound in sorted(groups.items()))
