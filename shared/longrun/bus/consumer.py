"""Consume a queue: decode, claim the inbox row, handle, commit — then ack.

The inbox row, the handler's state change and its outbox rows commit in ONE
transaction; the delivery is acked only after that commit, and never held during long
work (handlers persist what takes time and return). A redelivered message finds its
inbox row and gets the recorded outcome without touching state.

A queue is a serial lane: one message at a time, in delivery order, so per-run order
holds. With ``batch`` > 1, the messages already delivered and waiting (up to ``batch``) are
handled in delivery order in ONE transaction: their inbox rows claimed in one statement,
their outcomes recorded in one, one commit, one ack for all. If that transaction fails, it
is rolled back and its messages are handled again one at a time, each with its own retries.
A failing message is retried in place (never skipped, which would reorder the run's later
messages) until it succeeds, or until ``max_attempts`` failures put it in
quarantine. Undecodable messages and unknown schema versions go to quarantine at
once with their reason. The broker's delivery-limit is the backstop for a message
that kills the process before the app can count it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from opentelemetry.trace import SpanKind
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun import faults, logs, metrics, otel
from longrun.bus.connection import Bus
from longrun.db import inbox
from longrun.db import quarantine as quarantine_rows
from longrun.db.errors import is_transient
from longrun.envelope import Envelope, decode
from longrun.errors import LongrunError, PoisonMessage
from longrun.ports.inbox import Outcome

logger = logging.getLogger(__name__)

STOP_GRACE = 5.0

PUBLISHER: ContextVar[str | None] = ContextVar("longrun_publisher", default=None)
"""While a handler runs: the broker user that published its message (the AMQP ``user_id``, which
RabbitMQ checked against the publishing connection), or None when the message named none."""

Handler = Callable[[AsyncConnection, Envelope], Awaitable[dict[str, Any]]]
Prelude = Callable[[AsyncConnection, list[Envelope]], Awaitable[None]]
"""Runs first in each transaction of a consumer, with the envelopes it handles (one, or a batch's):
e.g. to take their locks in one order, before any handler."""
Refuser = Callable[[AsyncConnection, bytes, PoisonMessage], Awaitable[None]]
"""Runs in the transaction that quarantines an unreadable message, with its body and why: e.g. to
answer its producer."""


OutcomeHook = Callable[[Outcome], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class OwnClaim:
    """A handler that writes its inbox row itself, in its state change's one statement
    (``inbox.handled_once``): called outside any transaction, it returns the outcome, recorded
    by a first delivery or new. One round trip per message instead of BEGIN, claim, change,
    outcome and COMMIT."""

    handle: Callable[[Envelope], Awaitable[Outcome]]


class QueueConsumer:
    """One queue, one channel, one processing task."""

    def __init__(self, *, bus: Bus, engine: AsyncEngine, service: str, queue: str, handler: Handler | OwnClaim,
                 prefetch: int, max_attempts: int, on_outcome: OutcomeHook | None = None, batch: int = 1,
                 prelude: Prelude | None = None, refuser: Refuser | None = None) -> None:
        if batch > 1 and isinstance(handler, OwnClaim):
            raise ValueError(f"{queue}: a handler that claims its own inbox rows handles one message at a time "
                             f"(batch=1), got batch={batch}")
        self.bus = bus
        self.batch = batch
        self.prelude = prelude
        self.refuser = refuser
        self.engine = engine
        self.service = service
        self.queue = queue
        self.handler = handler
        self.prefetch = prefetch
        self.max_attempts = max_attempts
        self.on_outcome = on_outcome
        self._channel: AbstractChannel | None = None
        self._inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._current: asyncio.Future[None] | None = None
        self._tag: str | None = None
        self._registered: Mapping[str, object] = {}

    @property
    def alive(self) -> bool:
        """Consuming: its loop runs, its channel is open and the broker still has its consumer. On a
        live connection the broker may close one channel (a delivery unacked past its ack timeout) or
        cancel one consumer (its queue deleted or recovering); no connection event reports either."""
        return (self._task is not None and not self._task.done()
                and self._channel is not None and not self._channel.is_closed
                and self._tag in self._registered)

    async def start(self) -> None:
        self._channel = await self.bus.channel(prefetch=self.prefetch)
        queue = await self._channel.get_queue(self.queue, ensure=False)
        self._task = asyncio.create_task(self._loop(), name=f"consume {self.queue}")
        # The protocol channel's consumers by tag: a cancel from the broker removes ours.
        self._registered = (await self._channel.get_underlay_channel()).consumers
        self._tag = await queue.consume(self._inbox.put)

    async def stop(self) -> None:
        """Finish the message in hand, then close the channel so the rest is requeued."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._current is not None and not self._current.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._current), timeout=STOP_GRACE)
            except (TimeoutError, Exception):
                self._current.cancel()
        if self._channel is not None and not self._channel.is_closed:
            try:
                await self._channel.close()
            except Exception as e:
                logger.debug("closing channel of %s: %r", self.queue, e)

    async def _loop(self) -> None:
        while True:
            messages = [await self._inbox.get()]
            while len(messages) < self.batch and not self._inbox.empty():
                messages.append(self._inbox.get_nowait())
            # Shielded: a handover lets the messages in hand finish their commit and ack
            # (``stop`` waits for them) rather than leaving them half-handled.
            work = self._process(messages[0]) if len(messages) == 1 else self._process_together(messages)
            self._current = asyncio.ensure_future(work)
            await asyncio.shield(self._current)

    async def _process_together(self, messages: list[AbstractIncomingMessage]) -> None:
        decoded: list[tuple[AbstractIncomingMessage, Envelope]] = []
        for message in messages:
            try:
                decoded.append((message, decode(message.body)))
            except PoisonMessage as e:
                await self._quarantine(message, e, attempts=1)
        if not decoded:
            return
        try:
            results = await self._handle_together(decoded)
        except Exception as e:
            logger.warning("%s: a batch of %d failed (%r); handling its messages one at a time",
                           self.queue, len(decoded), e)
            for message, envelope in decoded:
                await self._traced_handle(message, envelope)
            return
        faults.crash_point("consumer.after_commit_before_ack")
        # Every earlier delivery of this channel is acked already: one ack covers the batch.
        await _ack(decoded[-1][0], multiple=True)
        if self.on_outcome is not None:
            for result in results:
                await self.on_outcome(result)

    async def _handle_together(self, decoded: list[tuple[AbstractIncomingMessage, Envelope]]) -> list[Outcome]:
        """``_handle_once`` for several messages in one transaction; a repeated id within the batch
        is a duplicate of its first copy."""
        envelopes = [envelope for _, envelope in decoded]
        firsts: dict[str, Envelope] = {}
        for envelope in envelopes:
            firsts.setdefault(envelope.event_id, envelope)
        async with self.engine.begin() as conn:
            if self.prelude is not None:
                await self.prelude(conn, envelopes)
            claims = await inbox.claim_many(conn, self.service, [
                inbox.Message(e.event_id, e.type, e.run_id) for e in firsts.values()])
            done: dict[str, Outcome] = {}
            results: list[Outcome] = []
            for message, envelope in decoded:
                claim, first = claims[envelope.event_id], done.get(envelope.event_id)
                recorded = (first.outcome if first is not None
                            else claim.outcome if isinstance(claim, inbox.Duplicate) else None)
                if recorded is not None:
                    self._dropped(envelope)
                    results.append(Outcome(envelope, recorded, duplicate=True))
                    continue
                assert not isinstance(self.handler, OwnClaim)
                with self._span(message, envelope, None):
                    result = Outcome(envelope, await self.handler(conn, envelope), duplicate=False)
                done[envelope.event_id] = result
                results.append(result)
            await inbox.record_outcomes(conn, self.service, {k: r.outcome for k, r in done.items()})
        return results

    async def _process(self, message: AbstractIncomingMessage) -> None:
        try:
            envelope = decode(message.body)
        except PoisonMessage as e:
            await self._quarantine(message, e, attempts=1)
            return
        await self._traced_handle(message, envelope)

    async def _traced_handle(self, message: AbstractIncomingMessage, envelope: Envelope) -> None:
        root = (message.headers or {}).get(otel.RUN_TRACE_HEADER)
        with self._span(message, envelope, root if isinstance(root, str) else None):
            await self._handle(message, envelope)

    @contextmanager
    def _span(self, message: AbstractIncomingMessage, envelope: Envelope, run_root: str | None) -> Iterator[None]:
        """The message's ``process`` span, a child of its run's root when the relay said which; log
        records written meanwhile name its run and tenant, and ``PUBLISHER`` its publisher."""
        publisher = PUBLISHER.set(message.user_id)
        try:
            with logs.bound(envelope.run_id, envelope.tenant_id), otel.run_span(
                    f"process {self.queue}", run_root, cause=envelope.trace, kind=SpanKind.CONSUMER, attributes={
                        "messaging.system": "rabbitmq", "messaging.destination.name": self.queue,
                        "messaging.message.id": envelope.event_id, "messaging.operation.name": "process",
                        "messaging.operation.type": "process", "longrun.run_id": envelope.run_id or "",
                        "longrun.tenant": envelope.tenant_id}):
                yield
        finally:
            PUBLISHER.reset(publisher)

    async def _handle(self, message: AbstractIncomingMessage, envelope: Envelope) -> None:
        attempt = 0
        while True:
            attempt += 1
            try:
                result = await self._handle_once(envelope)
                break
            except PoisonMessage as e:
                await self._quarantine(message, e, attempts=attempt)
                return
            except Exception as e:
                if is_transient(e):
                    logger.warning("%s: database unavailable handling %s (%r); retrying",
                                   self.queue, envelope.event_id, e)
                    await asyncio.sleep(min(0.2 * attempt, 3.0))
                    attempt -= 1
                    continue
                logger.exception("%s: handler failed on %s (attempt %d)", self.queue, envelope.event_id, attempt)
                attempts = await self._count_failure(envelope.event_id, e)
                if attempts >= self.max_attempts:
                    await self._quarantine(message, e, attempts=attempts)
                    return
                await asyncio.sleep(min(0.1 * 2 ** attempt, 2.0))
        faults.crash_point("consumer.after_commit_before_ack")
        await _ack(message)
        if self.on_outcome is not None:
            await self.on_outcome(result)

    async def _handle_once(self, envelope: Envelope) -> Outcome:
        if isinstance(self.handler, OwnClaim):
            result = await self.handler.handle(envelope)
            if result.duplicate:
                self._dropped(envelope)
            return result
        async with self.engine.begin() as conn:
            claim = await inbox.claim(conn, self.service, message_id=envelope.event_id,
                                      message_type=envelope.type, run_id=envelope.run_id)
            if isinstance(claim, inbox.Duplicate):
                self._dropped(envelope)
                return Outcome(envelope, claim.outcome, duplicate=True)
            if self.prelude is not None:
                await self.prelude(conn, [envelope])
            outcome = await self.handler(conn, envelope)
            await inbox.record_outcome(conn, self.service, message_id=envelope.event_id, outcome=outcome)
            return Outcome(envelope, outcome, duplicate=False)

    def _dropped(self, envelope: Envelope) -> None:
        metrics.DUPLICATES.labels(self.service).inc()
        logger.info("duplicate %s dropped on %s; recorded outcome returned", envelope.event_id, self.queue)

    async def _count_failure(self, message_id: str, error: Exception) -> int:
        try:
            async with self.engine.begin() as conn:
                attempts, _ = await quarantine_rows.record_failure(
                    conn, service=self.service, message_id=message_id, error=repr(error)[:2000])
                return attempts
        except Exception:
            logger.exception("%s: could not count the failure of %s", self.queue, message_id)
            return 0

    async def _quarantine(self, message: AbstractIncomingMessage, error: Exception, *, attempts: int) -> None:
        code = error.code.value if isinstance(error, LongrunError) else "handler_error"
        reason = str(error) if isinstance(error, LongrunError) else f"{error.__class__.__name__}: {error}"
        while True:
            try:
                async with self.engine.begin() as conn:
                    await quarantine_rows.put(
                        conn, owner=self.service, queue=self.queue, body=message.body,
                        headers=_plain(message.headers), message_id=message.message_id,
                        error_code=code, reason=reason, attempts=attempts)
                    if self.refuser is not None and isinstance(error, PoisonMessage):
                        await self.refuser(conn, message.body, error)
                break
            except Exception as e:
                if not is_transient(e):
                    raise
                await asyncio.sleep(1.0)
        logger.error("%s: quarantined %s: %s", self.queue, message.message_id, reason)
        await _ack(message)


async def _ack(message: AbstractIncomingMessage, *, multiple: bool = False) -> None:
    try:
        await message.ack(multiple=multiple)
    except Exception as e:
        # The channel is gone: the broker redelivers, and the inbox absorbs it.
        logger.warning("ack failed (%r); the redelivery will be deduplicated", e)


def _plain(headers: dict[str, Any] | None) -> dict[str, Any]:
    """Headers as JSON-safe values (AMQP tables may hold bytes and datetimes)."""
    out: dict[str, Any] = {}
    for key, value in (headers or {}).items():
        if isinstance(value, bytes):
            out[key] = value.decode(errors="replace")
        elif isinstance(value, (str, int, float, bool)) or value is None:
            out[key] = value
        else:
            out[key] = repr(value)
    return out


class PartitionedConsumer:
    """The partition queues of one service that this replica currently owns.

    ``wanted`` follows the partition leases; ``active`` holds the running consumers. Every start
    and stop happens under one lock, so an ownership round and a reconnect never interleave on a
    partition (a second consumer started beside the first, a stop that misses a start still in
    flight, a consumer recorded after the reconnect swept the dead ones). ``reconcile``, run each
    ownership round, repairs what can still diverge: a start that failed, a channel that died.
    """

    def __init__(self, *, bus: Bus, engine: AsyncEngine, service: str, queue_for: Callable[[int], str],
                 handler: Handler | OwnClaim, prefetch: int, max_attempts: int,
                 on_outcome: OutcomeHook | None = None) -> None:
        self.bus = bus
        self._make = lambda k: QueueConsumer(
            bus=bus, engine=engine, service=service, queue=queue_for(k), handler=handler,
            prefetch=prefetch, max_attempts=max_attempts, on_outcome=on_outcome)
        self.active: dict[int, QueueConsumer] = {}
        self.wanted: set[int] = set()
        self._lock = asyncio.Lock()

    @property
    def consuming(self) -> bool:
        """Every partition this replica owns has a live consumer."""
        return self.bus.connected and all(
            k in self.active and self.active[k].alive for k in self.wanted)

    async def acquire(self, partitions: set[int]) -> None:
        """Start the consumers of ``partitions`` together: a takeover costs one round trip, not P."""
        self.wanted |= partitions
        async with self._lock:
            await self._start_all(partitions)

    async def release(self, partitions: set[int]) -> None:
        self.wanted -= partitions
        async with self._lock:
            await asyncio.gather(*(self._stop(k) for k in partitions))

    async def reconcile(self, owned: set[int]) -> None:
        """Make the consumers match ``owned``: start the missing and the dead ones, stop the others."""
        self.wanted = set(owned)
        if not self.bus.connected:
            # However the drop went unreported, ``supervise`` now reconnects and resumes.
            self.bus.lost.set()
        async with self._lock:
            for k in sorted(self.active.keys() - self.wanted):
                logger.warning("partition %d is consumed but not owned; stopping its consumer", k)
                await self._stop(k)
            await self._start_all(self.wanted)

    async def supervise(self) -> None:
        """After a lost connection: stop every consumer, reconnect, resume the wanted partitions.
        Nothing may end this loop: without it a lost connection is never replaced."""
        while True:
            await self.bus.lost.wait()
            logger.warning("connection to RabbitMQ lost; %d partition(s) to resume", len(self.wanted))
            try:
                async with self._lock:
                    await asyncio.gather(*(self._stop(k) for k in list(self.active)))
                await self.bus.ensure_connected()
                await self.reconcile(self.wanted)
            except Exception:
                logger.exception("resuming the partitions failed; trying again")
                await asyncio.sleep(1.0)

    async def _start_all(self, partitions: set[int]) -> None:
        ordered = sorted(partitions)  # a copy: ``wanted`` may change while the starts are awaited
        outcomes = await asyncio.gather(*(self._start(k) for k in ordered), return_exceptions=True)
        for k, outcome in zip(ordered, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                logger.error("could not start partition %d; the next round retries", k, exc_info=outcome)

    async def _start(self, k: int) -> None:
        """Start k's consumer unless a live one runs; while disconnected, ``supervise`` will."""
        consumer = self.active.get(k)
        if consumer is not None and consumer.alive:
            return
        if consumer is not None:
            logger.warning("the consumer of partition %d died; starting a new one", k)
            await self._stop(k)
        if not self.bus.connected:
            return
        consumer = self._make(k)
        try:
            await consumer.start()
        except BaseException:
            await consumer.stop()  # leave no channel or task behind a half-done start
            raise
        self.active[k] = consumer

    async def _stop(self, k: int) -> None:
        consumer = self.active.pop(k, None)
        if consumer is not None:
            await consumer.stop()
