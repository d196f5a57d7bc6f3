"""Eager publish: a worker publishes its own transitions' outbox rows right after their commit.

The relay's hop (its wake on NOTIFY, its read) is skipped for the rows a lease holder writes when
nothing of their partition is unsent (``db.outbox.eager_insert_sql`` marks them ``eager_until``): no
row written before them can be overtaken, and the relay stops each partition at its first eager row
still in its grace, so nothing written after them overtakes them either. The worker publishes them
on its confirm channel, a run's rows one commit after another, and marks the confirmed ones sent
in batches; each mark wakes the relay (NOTIFY) for the rows that waited behind them.

Whatever is not confirmed (a crash between the commit and the publish, the broker away, a nack) is
left unsent, and so is every later eager row of the same run: the relay publishes them in id order
once their grace has passed. A crash between the confirm and the mark publishes a row twice;
consumers' inboxes and the client's seq check absorb the duplicate.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from sqlalchemy import text

from longrun import faults, otel
from longrun.bus.codec import to_message
from longrun.bus.connection import Bus
from longrun.bus.traced import publish_traced
from longrun.db import driver, outbox
from longrun.db.driver import Pool
from longrun.ports.runs import Message

logger = logging.getLogger(__name__)

# The relay is told at once: a row written after these may have been skipped for them, unseen by
# this statement if it committed meanwhile.
_MARK = driver.Statement(text(
    "WITH marked AS (UPDATE outbox SET published_at = now() WHERE id = ANY(CAST(:ids AS bigint[]))) "
    f"SELECT pg_notify('{outbox.NOTIFY_CHANNEL}', '')"))


class EagerPublisher:
    def __init__(self, bus: Bus, statements: Pool) -> None:
        self.bus = bus
        self.statements = statements
        self._chains: dict[str, asyncio.Task[bool]] = {}
        self._confirmed: list[int] = []
        self._marking: asyncio.Task[None] | None = None
        self._connecting: asyncio.Task[None] | None = None

    def publish(self, run_id: str, ids: Sequence[int], messages: Sequence[Message]) -> None:
        """Publish ``messages`` (the rows ``ids``, committed) after the run's earlier ones; never raises."""
        previous = self._chains.get(run_id)
        task = asyncio.create_task(self._send(previous, ids, messages))
        self._chains[run_id] = task
        task.add_done_callback(lambda done: self._forget(run_id, done))

    def _forget(self, run_id: str, done: asyncio.Task[bool]) -> None:
        if self._chains.get(run_id) is done:
            del self._chains[run_id]

    async def _send(self, previous: asyncio.Task[bool] | None, ids: Sequence[int],
                    messages: Sequence[Message]) -> bool:
        """Whether every row was confirmed; an earlier row of the run not confirmed leaves these to the relay."""
        if previous is not None and not await previous:
            return False
        faults.crash_point("worker.after_commit_before_eager_publish")
        if not self.bus.connected:
            self._reconnect()
            return False
        envelopes = [outbox.envelope_of(m.envelope.type, outbox.kept(m.envelope)) for m in messages]
        try:
            if otel.exporting():
                # The run's root: the turn that committed them made it current (``otel.root``).
                results = await publish_traced(self.bus, [(m.exchange, m.routing_key, e, otel.root())
                                                          for m, e in zip(messages, envelopes, strict=True)])
            else:
                results = await self.bus.publish_many([(m.exchange, m.routing_key, to_message(e))
                                                       for m, e in zip(messages, envelopes, strict=True)])
        except Exception as e:
            logger.warning("eager publish of %d row(s) failed (%r): the relay publishes them", len(ids), e)
            return False
        confirmed = []
        for row_id, error in zip(ids, results, strict=True):
            if error is not None:
                break
            confirmed.append(row_id)
        faults.crash_point("worker.after_eager_publish_before_mark")
        if confirmed:
            self._confirmed += confirmed
            if self._marking is None or self._marking.done():
                self._marking = asyncio.create_task(self._mark())
        return len(confirmed) == len(ids)

    def _reconnect(self) -> None:
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.create_task(self.bus.ensure_connected())

    async def _mark(self) -> None:
        """Mark what was confirmed, in one statement per batch, until nothing more is."""
        while self._confirmed:
            ids, self._confirmed = self._confirmed, []
            try:
                async with self.statements.connection() as conn:
                    await driver.execute(conn, _MARK, {"ids": ids})
            except Exception as e:
                # Left unmarked, they are published again by the relay after their grace: duplicates, never a loss.
                logger.warning("marking %d eagerly published row(s) failed (%r)", len(ids), e)

    async def close(self) -> None:
        """Let the publishes in flight finish and their marks be written."""
        chains = list(self._chains.values())
        if chains:
            await asyncio.gather(*chains, return_exceptions=True)
        if self._marking is not None:
            await asyncio.gather(self._marking, return_exceptions=True)
        if self._connecting is not None:
            self._connecting.cancel()
        await self.bus.close()
