"""The tenants whose budget is spent for the period now running, as a worker asks before a model call
(``ports.stores.SpentTenants``).

One read of the spent tenants serves every model call of the worker for ``cache_seconds``; a worker
that calls no model reads nothing. A call finding the copy older than that waits for a fresh read
(one indexed statement at most once per ``cache_seconds``, short beside the model call it precedes),
so a tenant whose budget another worker spent is seen spent within that time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

logger = logging.getLogger(__name__)

_SPENT = text("SELECT tenant_id, extract(epoch FROM period_end) AS until FROM tenant_budget_use "
              "WHERE spent AND period_end > now()")


class PgSpentTenants:
    def __init__(self, engine: AsyncEngine, *, cache_seconds: float = 1.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.cache_seconds = cache_seconds
        self.monotonic = monotonic
        self._spent: dict[str, float] = {}
        self._fresh_until = 0.0
        self._reading = asyncio.Lock()

    async def spent_until(self, tenant_id: str, *, fresh: bool = False) -> float | None:
        if fresh or self.monotonic() >= self._fresh_until:
            await self._refresh(asked=self.monotonic())
        return self._spent.get(tenant_id)

    async def _refresh(self, *, asked: float) -> None:
        async with self._reading:
            if self._fresh_until - self.cache_seconds > asked:
                return  # read by another caller since this one asked
            try:
                async with self.engine.connect() as conn:
                    self._spent = {row.tenant_id: float(row.until) for row in await conn.execute(_SPENT)}
            except Exception as e:
                if self._fresh_until == 0.0:
                    raise  # no copy yet: "nobody is spent" would be a guess, so the step fails as on any outage
                logger.warning("reading the spent tenant budgets failed (%r); the copy is kept", e)
            self._fresh_until = self.monotonic() + self.cache_seconds
