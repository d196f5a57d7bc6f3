"""One tool call in the worker, watched: its start-to-close limit, its heartbeats, its progress.

``supervise`` awaits a call and cancels it once it overran ``start_to_close`` or went
``heartbeat_timeout`` without a heartbeat (``CallTimedOut`` names which). Like ``asyncio.wait_for``
it waits for a cancelled call to end: a call that ignores cancellation keeps the worker's step
where it is, and the call's durable timers (``domain.calls``) move the run on without it. A call
that answers after all is answered.

``Call`` is what ``authoring.heartbeat`` reports to while the call runs. A call on record (its
ledger row committed before it ran) gets its heartbeats' details written to that row, at most every
``interval`` (the last ones when the call ends), each write moving its durable heartbeat timer in
the same statement. A watched call (one with ``heartbeat_timeout``) whose heartbeat the store refuses
(the attempt is no longer this worker's: a timer gave up on it, or another worker took the run)
is cancelled and ends with ``LeaseLost``.

A call without ``heartbeat_timeout`` costs what ``asyncio.wait_for`` costs: no watch task; one not on
record reports its heartbeats to the shared ``UNRECORDED``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from longrun.authoring import CURRENT_CALL
from longrun.errors import CallTimedOut

logger = logging.getLogger(__name__)
T = TypeVar("T")

Record = Callable[[Mapping[str, Any] | None], Awaitable[bool]]
"""Writes a heartbeat with the details given; False when the store refused it."""


class Call:
    """The watch over a call on record: its last heartbeat, and its details written to its ledger row."""

    def __init__(self, *, record: Record, interval: float, refused: Exception,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``refused``: what the call ends with when a heartbeat is refused."""
        self.record = record
        self.interval = interval
        self.refused = refused
        self.clock = clock
        self.last_beat = clock()
        self.details: Mapping[str, Any] | None = None
        self.pending = False
        self.written_at = float("-inf")
        self.lost = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._sleeping = False
        self._closing = False

    def beat(self, details: Mapping[str, Any] | None) -> None:
        self.last_beat = self.clock()
        if details is not None:
            self.details = details
        self.pending = True
        if self._writer is None:
            wait = max(0.0, self.written_at + self.interval - self.last_beat)
            self._writer = asyncio.get_running_loop().create_task(self._writing(wait))

    async def _writing(self, wait: float) -> None:
        """Writes pending details every ``interval`` while heartbeats keep coming in (one task per call)."""
        try:
            while self.pending and not self.lost.is_set() and not self._closing:
                self._sleeping = True
                await asyncio.sleep(wait)
                self._sleeping = False
                await self._write()
                wait = max(0.0, self.written_at + self.interval - self.clock())
        finally:
            self._writer = None

    async def _write(self) -> None:
        self.pending, self.written_at = False, self.clock()
        try:
            if not await self.record(self.details):
                self.lost.set()
        except Exception as e:
            logger.warning("heartbeat not recorded (%r); the call goes on", e)

    async def close(self) -> None:
        """The call ended: a write waiting for its turn goes now (the last details are kept)."""
        self._closing = True
        writer = self._writer
        if writer is not None:
            if self._sleeping:
                writer.cancel()  # a write under way is let finish: a statement is not cut off midway
            await asyncio.gather(writer, return_exceptions=True)
        if self.pending and not self.lost.is_set():
            await self._write()


class Unrecorded:
    """What the heartbeats of a call that is not on record report to (a pure or read call without
    ``heartbeat_timeout``): nothing is kept, and nothing is created per call."""

    def beat(self, details: Mapping[str, Any] | None) -> None:
        pass

    async def close(self) -> None:
        pass


UNRECORDED = Unrecorded()


async def supervise(call: Coroutine[Any, Any, T], watch: Call | Unrecorded, *, start_to_close: float,
                    heartbeat_timeout: float | None) -> T:
    """``call``'s answer, ``watch`` being what its heartbeats report to (``authoring.heartbeat``).

    Raises:
        CallTimedOut: it overran ``start_to_close`` or went ``heartbeat_timeout`` without a heartbeat,
            and ended when cancelled.
        Exception: ``watch.refused`` once a heartbeat was refused; whatever the call raised.
    """
    reset = CURRENT_CALL.set(watch)
    try:
        if heartbeat_timeout is None:
            try:
                return await asyncio.wait_for(call, timeout=start_to_close)
            except TimeoutError:
                raise CallTimedOut("start_to_close", start_to_close) from None
        if not isinstance(watch, Call):
            call.close()
            raise ValueError("a call watched for its heartbeats is on record: its watch must be a Call")
        return await _watched(asyncio.ensure_future(call), watch, start_to_close=start_to_close,
                              heartbeat_timeout=heartbeat_timeout)
    finally:
        CURRENT_CALL.reset(reset)
        await watch.close()


async def _watched(task: asyncio.Future[T], watch: Call, *, start_to_close: float, heartbeat_timeout: float) -> T:
    loop = asyncio.get_running_loop()
    lost = loop.create_task(watch.lost.wait())
    deadline = watch.clock() + start_to_close
    try:
        while True:
            now = watch.clock()
            silent_until = watch.last_beat + heartbeat_timeout
            if now >= deadline or now >= silent_until or watch.lost.is_set():
                break
            await asyncio.wait({task, lost}, timeout=min(deadline, silent_until) - now,
                               return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
        expired = ("start_to_close", start_to_close) if watch.clock() >= deadline else ("heartbeat", heartbeat_timeout)
        task.cancel()
        # As wait_for: the call ends first (one that ignores cancellation holds the step here).
        await asyncio.wait({task})
        if not task.cancelled():
            return task.result()
        if watch.lost.is_set():
            raise watch.refused
        raise CallTimedOut(*expired)
    finally:
        lost.cancel()
        if not task.done():
            task.cancel()
