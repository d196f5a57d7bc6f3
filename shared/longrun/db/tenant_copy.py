"""A worker's copy of a per-tenant reading (every tenant's row at once), kept ``cache_seconds``.

One statement serves every call that asks within that time, and the callers that asked while it was
being read wait for that read instead of reading again. A read that fails keeps the copy; with no
copy yet it raises, as any statement would during an outage: an empty copy would be a guess (no
tenant spent, no tool bounded).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from sqlalchemy import TextClause
from sqlalchemy.ext.asyncio import AsyncEngine

logger = logging.getLogger(__name__)

V = TypeVar("V")


class TenantCopy(Generic[V]):
    def __init__(self, engine: AsyncEngine, query: TextClause, value_of: Callable[[Any], V], *, what: str,
                 cache_seconds: float = 1.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        """``query`` returns a ``tenant_id`` column; ``value_of`` makes a row's value; ``what`` names
        the reading in the warning of a failed one."""
        self.engine = engine
        self.query = query
        self.value_of = value_of
        self.what = what
        self.cache_seconds = cache_seconds
        self.monotonic = monotonic
        self._copy: dict[str, V] = {}
        self._fresh_until = 0.0
        self._reading = asyncio.Lock()

    async def get(self, tenant_id: str, *, fresh: bool = False) -> V | None:
        """``tenant_id``'s value (None: no row); ``fresh``: read now whatever the copy's age."""
        if fresh or self.monotonic() >= self._fresh_until:
            await self._refresh(asked=self.monotonic())
        return self._copy.get(tenant_id)

    async def _refresh(self, *, asked: float) -> None:
        async with self._reading:
            if self._fresh_until - self.cache_seconds > asked:
                return  # read by another caller since this one asked
            try:
                async with self.engine.connect() as conn:
                    self._copy = {row.tenant_id: self.value_of(row) for row in await conn.execute(self.query)}
            except Exception as e:
                if self._fresh_until == 0.0:
                    raise  # no copy yet: the step fails as on any outage
                logger.warning("reading %s failed (%r); the copy is kept", self.what, e)
            self._fresh_until = self.monotonic() + self.cache_seconds
