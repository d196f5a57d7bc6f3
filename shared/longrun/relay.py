"""The outbox relay: committed outbox rows -> RabbitMQ, with confirms, then marked sent.

Each round takes the oldest unpublished rows of all the partitions this replica owns
(each partition is owned by exactly one relay replica at a time) in one read — every
round rescans, so a row whose transaction commits late is never skipped — publishes
them pipelined on one confirm channel (the broker keeps that order), and marks the
confirmed ones in the statement that reads the next rows: one statement per round. Within a
partition nothing after a failed publish is marked, so the next round publishes it again after
the failed one: per-run order holds.
A crash between confirm and mark publishes the rows again; consumers' inboxes absorb
the duplicates.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg

from longrun import faults, otel
from longrun.bus.codec import to_message
from longrun.bus.connection import Bus
from longrun.bus.traced import publish_traced
from longrun.db import outbox
from longrun.db.driver import Pool
from longrun.db.engine import psycopg_dsn
from longrun.db.errors import is_transient

logger = logging.getLogger(__name__)


class Relay:
    def __init__(self, statements: Pool, bus: Bus, *, batch: int, poll_interval: float) -> None:
        self.statements = statements
        self.bus = bus
        self.batch = batch
        self.poll_interval = poll_interval
        self.owned: set[int] = set()
        self.wake = asyncio.Event()
        self.published = 0
        self._lock = asyncio.Lock()

    async def acquire(self, partitions: set[int]) -> None:
        self.owned |= partitions
        self.wake.set()

    async def release(self, partitions: set[int]) -> None:
        # Wait for a drain in progress so two relays never publish one partition at once.
        async with self._lock:
            self.owned -= partitions

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=self.poll_interval)
            except TimeoutError:
                pass
            self.wake.clear()
            try:
                await self.bus.ensure_connected()
                async with self._lock:
                    await self.drain()
            except Exception as e:
                if not is_transient(e):
                    logger.exception("relay round failed")
                else:
                    logger.warning("relay round: database unavailable (%r)", e)
                await asyncio.sleep(0.5)

    async def drain(self) -> None:
        """Publish until the owned partitions have nothing unpublished (or a publish failed)."""
        confirmed: list[int] = []
        while True:
            # One statement per round, outside a transaction: it marks the rows the last round got
            # confirmed and reads the next (BEGIN and COMMIT would be two more round trips).
            traced = otel.exporting()
            async with self.statements.connection() as conn:
                rows = await outbox.unpublished(conn, self.owned, self.batch, marked=confirmed, with_roots=traced)
            self.published += len(confirmed)
            if not rows:
                return
            if traced:
                results = await publish_traced(self.bus, [(row.exchange, row.routing_key, row.envelope(),
                                                            row.run_trace) for row in rows])
            else:
                results = await self.bus.publish_many(
                    [(row.exchange, row.routing_key, to_message(row.envelope())) for row in rows])
            broken: set[int] = set()
            confirmed = []
            for row, error in zip(rows, results, strict=True):
                if error is not None:
                    broken.add(row.partition)
                elif row.partition not in broken:
                    confirmed.append(row.id)
            faults.crash_point("relay.after_publish_before_mark")
            failures = [e for e in results if e is not None]
            if failures:
                async with self.statements.connection() as conn:
                    await outbox.mark_published(conn, confirmed)
                self.published += len(confirmed)
                logger.warning("partitions %s: %d of %d publishes failed, first: %s",
                               sorted(broken), len(failures), len(rows), failures[0])
                return

    async def listen(self, database_url: str, stopping: asyncio.Event) -> None:
        """NOTIFY is only a hint (no replay): the poll in ``run`` is the safety net."""
        while not stopping.is_set():
            try:
                async with await psycopg.AsyncConnection.connect(
                        psycopg_dsn(database_url), autocommit=True) as conn:
                    await conn.execute(f"LISTEN {outbox.NOTIFY_CHANNEL}")
                    self.wake.set()
                    async for _ in conn.notifies():
                        self.wake.set()
                        if stopping.is_set():
                            return
            except (psycopg.Error, OSError) as e:
                logger.warning("LISTEN connection lost (%r); polling until it is back", e)
                await asyncio.sleep(1.0)
