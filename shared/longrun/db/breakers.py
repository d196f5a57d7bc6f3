"""The far sides' circuit breakers as a worker asks them (``ports.stores.Breakers``), on PostgreSQL.

The worker keeps a copy of every breaker that is not clean, read again at most every
``cache_seconds`` in the background, so the common step asks no extra question: a far side its copy
shows closed is called at once. Only a call to a far side its copy shows open or half-open asks the
table (for the probe), and only unavailable answers and probes' answers are written (a success is
written only when the copy shows something counted). The worker's own writes update its copy at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.db import tool_health
from longrun.domain import breaker as machine
from longrun.domain.breaker import Admission, Breaker, BreakerSettings, BreakerState

logger = logging.getLogger(__name__)


class PgBreakers:
    """The worker's view of the circuit breakers, and its writes to them."""

    def __init__(self, engine: AsyncEngine, settings: BreakerSettings, *, cache_seconds: float,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.settings = settings
        self.cache_seconds = cache_seconds
        self.monotonic = monotonic
        self._known: dict[str, Breaker] = {}
        self._fresh_until = 0.0
        self._changes = 0
        self._refreshing: asyncio.Task[None] | None = None

    def view(self, far_side: str) -> Breaker:
        """The copy's breaker of ``far_side`` (clean when it has none); a copy past its age is read
        again in the background, never in the caller's way."""
        if self.monotonic() >= self._fresh_until and (self._refreshing is None or self._refreshing.done()):
            self._refreshing = asyncio.create_task(self._refresh(), name="tool health refresh")
        return self._known.get(far_side) or Breaker(far_side)

    async def admit(self, far_side: str, run_id: str) -> Admission:
        """Whether ``run_id`` may call ``far_side`` now: a call, the probe, or a wait."""
        if self.view(far_side).state is BreakerState.CLOSED:
            return Admission.CALL
        async with self.engine.begin() as conn:
            before, now = await tool_health.lock(conn, far_side)
            verdict, after = machine.admit(before, caller=run_id, now=now, settings=self.settings)
            if after != before:
                await tool_health.save(conn, after)
        self._learn(after)
        return verdict

    async def failed(self, far_side: str) -> Breaker:
        """An unavailable answer counted; the breaker after it."""
        async with self.engine.begin() as conn:
            before, now = await tool_health.lock(conn, far_side)
            after = machine.failed(before, now=now, settings=self.settings)
            if after != before:
                await tool_health.save(conn, after)
        self._learn(after)
        return after

    async def succeeded(self, far_side: str, *, probe: bool) -> None:
        """A call answered: the breaker closes. Written only for a probe or when something was counted."""
        if not probe and self.view(far_side).clean:
            return
        async with self.engine.begin() as conn:
            before, _ = await tool_health.lock(conn, far_side)
            after = machine.succeeded(before)
            if after != before:
                await tool_health.save(conn, after)
        self._learn(after)

    def _learn(self, breaker: Breaker) -> None:
        self._changes += 1
        if breaker.clean:
            self._known.pop(breaker.far_side, None)
        else:
            self._known[breaker.far_side] = breaker

    async def _refresh(self) -> None:
        changes = self._changes
        try:
            async with self.engine.connect() as conn:
                known = {b.far_side: b for b in await tool_health.not_clean(conn)}
        except Exception as e:
            logger.warning("reading the circuit breakers failed (%r); the copy is kept", e)
        else:
            if changes == self._changes:  # a write of ours meanwhile is newer than this read
                self._known = known
        self._fresh_until = self.monotonic() + self.cache_seconds
