"""Tool concurrency as the worker asks it (``domain.tool_permits``): permits of each tenant's bounded
tool groups, shared by every worker, asked only for a tool one of its tenant's groups bounds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class ToolPermits(Protocol):
    async def bounds(self, tenant_id: str) -> Mapping[str, int]:
        """The tenant's tool groups and their bounds (empty: none bounded), from a copy at most a
        moment old: a tenant without any costs a call no statement."""

    async def take(self, tenant_id: str, group: str, bound: int, run_id: str, holder: str) -> bool:
        """A permit of the tenant's ``group`` for ``run_id``'s call, held by the worker ``holder``;
        False when ``bound`` live permits are held by other calls."""

    async def release(self, tenant_id: str, group: str, run_id: str, holder: str) -> None:
        """The call's permit freed (its outcome is recorded), and the group's longest waiter woken."""

    async def wake_if_free(self, tenant_id: str, group: str, bound: int, run_id: str) -> None:
        """``run_id``, just parked for a permit, woken if one is free now: one freed between its take
        and its park found no waiter to wake."""
