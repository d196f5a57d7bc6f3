"""Eager publish after commit: a worker publishes the outbox rows of its own transition right after
COMMIT, on its confirm channel, and marks them sent; the relay publishes only what a crash or a
failed publish left behind, once the row's hold lapses (``LONGRUN_EAGER_PUBLISH_GRACE``).

Which rows (``offered``, pure): the rows about the run the statement moves, in that run's
partition, and only from a statement that holds the run's lease (the worker's fenced transition).
Rows about other runs (a slot handed on, a parent told of its child) and every row written by
operators, timers, the reconciler, the scheduler or in bulk stay with the relay. The transition
statement holds the offered rows only if no row of the partition is unpublished in its snapshot
except those this worker got confirmed and marks in that same statement (``db.outbox_hold``).

Why a run's messages still reach the bus in order (consumers drop a status event whose seq is not
above the last they saw, so a later row published before an earlier one loses the earlier one):

1. A run's rows are written in the order of its transitions, and each transition updates the run's
   row under its revision: a transition starts only after the one before it committed, so its rows
   take higher ids (allocated after that commit) and its statement sees every earlier row of the
   run committed. Ids are allocated before commit and transactions commit late, but only across
   runs; within a run commit order and id order agree.
2. A worker holds a transition's rows only when its statement saw no unpublished row in the
   partition but the ones it had confirmed. So every earlier row of the run is either confirmed
   (already in every queue it routes to) or was marked before it: nothing of the run is left for
   anyone to publish before the held rows.
3. The relay publishes each partition in id order and stops at the first row still held (it reads
   that row flagged and publishes nothing after it in its partition). So a row written after a held
   row — an operator's cancel, a timer's wake — is published only once the held row was confirmed
   and marked, or after its hold lapsed, and then by the relay itself in id order, earlier row first.
4. Within one transition the held rows go on one channel in id order, and are marked only up to the
   first that was not confirmed; the relay publishes the rest again in id order (the relay's rule).

What can happen is a copy: the relay publishing a row whose hold lapsed while its writer was still
publishing it, or a worker killed between confirm and mark. A copy of an earlier row after a later
one is dropped by seq (status events) or by the consumer's inbox (wakeups), as every copy is.

The publish is not waited for by the step: its confirms come while the run goes on, and only the
run's next transition waits for them (``hold``), so that its statement can mark them and hold its
own rows. Marks cost no round trip on the common path: a confirmed row's id rides in the worker's
next transition statement (``Hold.marks``); if none comes within ``MARK_DELAY`` one UPDATE marks
everything confirmed meanwhile. Until marked, a row counts as unpublished for everyone else: it
holds its partition's other writers to the relay for that long.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from longrun import faults
from longrun.bus.codec import to_message
from longrun.bus.connection import Bus
from longrun.db import outbox
from longrun.db.driver import Pool
from longrun.db.outbox_hold import Hold
from longrun.ports.runs import Message
from longrun.ports.stores import CrashPoints

logger = logging.getLogger(__name__)

MARK_DELAY = 0.01
"""Seconds a confirmed row waits for the worker's next statement to mark it before an UPDATE does."""


def offered(messages: Sequence[Message], run_id: str, partition: int) -> list[bool]:
    """Per message of a worker's transition of ``run_id`` (in ``partition``): whether the worker may
    publish it itself — a message about that run, in its partition."""
    return [m.envelope.run_id == run_id and m.partition == partition for m in messages]


class EagerPublisher:
    """One per worker process: holds its transitions' rows, publishes them after commit, marks them."""

    def __init__(self, bus: Bus, statements: Pool, *, grace: float,
                 crash_point: CrashPoints = faults.crash_point) -> None:
        self.bus = bus
        self.statements = statements
        self.grace = grace
        self.crash_point = crash_point
        self._confirmed: set[int] = set()
        """Rows confirmed and not yet given to a statement to mark. Each is given to one statement at
        a time: two statements marking the same rows would wait on each other's row locks (deadlock)."""
        self._marking: asyncio.Task[None] | None = None
        self._publishing: dict[str, asyncio.Task[None]] = {}
        """The publish of each run's last held rows, while it waits for its confirms."""

    async def hold(self, run_id: str, partition: int, messages: Sequence[Message]) -> Hold | None:
        """What the transition statement of ``run_id`` is to hold and mark; None: nothing. Waits for
        the confirms of the run's rows still being published: its statement marks them (point 2)."""
        publishing = self._publishing.get(run_id)
        if publishing is not None:
            await asyncio.wait([publishing])
        offers = offered(messages, run_id, partition)
        if not any(offers) and not self._confirmed:
            return None
        marks = sorted(self._confirmed)
        self._confirmed.clear()
        return Hold(partition, self.grace, marks, offers)

    def failed(self, hold: Hold) -> None:
        """The statement given ``hold`` failed: its marks go to the next one (marking twice is harmless)."""
        self._confirmed.update(hold.marks)

    def committed(self, run_id: str, hold: Hold) -> None:
        """After the commit of ``run_id``'s statement given ``hold`` (its marks done): what it held is
        published, and what the broker confirms is marked."""
        if not hold.held:
            return
        if len(hold.offered_rows) != len(hold.held):
            raise AssertionError(f"{len(hold.held)} rows held for {len(hold.offered_rows)} offered")
        self.crash_point("eager.after_commit_before_publish")
        task = asyncio.create_task(self._publish(hold), name=f"eager publish {run_id}")
        self._publishing[run_id] = task
        task.add_done_callback(lambda done: self._publishing.pop(run_id, None)
                               if self._publishing.get(run_id) is done else None)

    async def _publish(self, hold: Hold) -> None:
        # What the relay would send for these rows (``Relay.drain``), from the rows as written.
        results = await self.bus.publish_many([
            (row["exchange"], row["routing_key"], to_message(outbox.envelope_of(row["type"], row["payload"])))
            for row in hold.offered_rows])
        confirmed = []
        for row_id, error in zip(hold.held, results, strict=True):
            if error is not None:
                # Nothing after it is marked: the relay publishes it and the rest, in order, once they lapse.
                logger.warning("eager publish of outbox row %d failed (%s); the relay publishes it after %.1fs",
                               row_id, error, self.grace)
                break
            confirmed.append(row_id)
        self.crash_point("eager.after_confirm_before_mark")
        if confirmed:
            self._confirmed.update(confirmed)
            if self._marking is None or self._marking.done():
                self._marking = asyncio.create_task(self._mark_soon())

    async def _mark_soon(self) -> None:
        await asyncio.sleep(MARK_DELAY)
        await self.mark()

    async def mark(self) -> None:
        """Mark every row confirmed and not marked yet, in one UPDATE; on failure they stay to be
        marked by the next statement (or published again by the relay once their hold lapses)."""
        ids = sorted(self._confirmed)
        if not ids:
            return
        self._confirmed.clear()
        try:
            async with self.statements.connection() as conn:
                await outbox.mark_published(conn, ids)
        except Exception as e:
            logger.warning("marking %d eagerly published outbox rows failed (%r)", len(ids), e)
            self._confirmed.update(ids)

    async def close(self) -> None:
        """On shutdown: the publishes under way are waited for, and what was confirmed is marked now."""
        if self._publishing:
            await asyncio.wait(list(self._publishing.values()))
        if self._marking is not None:
            self._marking.cancel()
        await self.mark()
