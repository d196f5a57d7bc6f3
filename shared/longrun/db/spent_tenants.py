"""The tenants whose budget is spent for the period now running, as a worker asks before a model call
(``ports.stores.SpentTenants``).

One read of the spent tenants serves every model call of the worker for ``cache_seconds``; a worker
that calls no model reads nothing. A call finding the copy older than that waits for a fresh read
(one indexed statement at most once per ``cache_seconds``, short beside the model call it precedes),
so a tenant whose budget another worker spent is seen spent within that time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.db.tenant_copy import TenantCopy

_SPENT = text("SELECT tenant_id, extract(epoch FROM period_end) AS until FROM tenant_budget_use "
              "WHERE spent AND period_end > now()")


class PgSpentTenants:
    def __init__(self, engine: AsyncEngine, *, cache_seconds: float = 1.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._spent = TenantCopy(engine, _SPENT, lambda row: float(row.until), what="the spent tenant budgets",
                                 cache_seconds=cache_seconds, monotonic=monotonic)

    async def spent_until(self, tenant_id: str, *, fresh: bool = False) -> float | None:
        return await self._spent.get(tenant_id, fresh=fresh)
