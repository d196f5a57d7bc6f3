"""A named, durable consumer of a tenant's events: it resumes where it stopped.

Its queue ``<tenant>.consumer.<name>`` outlives the connection and the process (it expires only
after ``expires`` seconds without a consumer), so events published while it is away wait for it.
It holds at most ``max_length`` events; beyond that the broker drops the oldest (``drop-head``,
so a stalled consumer never blocks the runtime's publishers) and dead-letters each dropped one
to ``<tenant>.consumer.<name>.lost`` (kept up to ``LOST_KEPT`` times as many), which this
consumer reads to report the loss. A delivery is
acknowledged only once the handler has returned for it (or it was a repeat), so one taken but not
handled when the process died is delivered again, with the same ``event_id``.

What to hand on, and when, is decided by ``longrun_client.resequence``; this module does the I/O.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from longrun_client.bus import EVENTS_EXCHANGE, consumer_lost_queue, consumer_queue, tenant_pattern
from longrun_client.errors import PoisonMessage
from longrun_client.model import Envelope
from longrun_client.registry import decode
from longrun_client.resequence import Deliver, Gap, Late, Repeat, Resequencer, Step

__all__ = ["DurableConsumer", "Handler", "Missed", "OnMissed"]

logger = logging.getLogger(__name__)

LOST_KEPT = 10
"""The lost-letters queue keeps this many times the queue's length: past it, even a loss goes
unreported by the broker (the resequencer still sees most as a break in a run's chain)."""
Missed = Gap | Late
"""What a consumer reports instead of handing on: a ``Gap`` (events that will not come) or a
``Late`` event (it came after a later one of its run was handed on)."""
Handler = Callable[[Envelope], Awaitable[None]]
OnMissed = Callable[[Missed], Awaitable[None] | None]


class DurableConsumer:
    """Hands a tenant's events to ``handler`` (awaited, one at a time) each once, a run's in order,
    and what it cannot hand on to ``on_missed``. Made by ``Client.consume``.

    A handler that raises stops the consumer: its channel closes, so the event and every one not
    yet acknowledged go back to the queue for the next start; ``join`` raises the error."""

    def __init__(self, channel: AbstractChannel, handler: Handler, on_missed: OnMissed,
                 resequencer: Resequencer) -> None:
        self._channel = channel
        self._handler = handler
        self._on_missed = on_missed
        self._resequencer = resequencer
        self._deliveries: dict[str, list[AbstractIncomingMessage]] = {}
        """Per event id, its deliveries not acknowledged yet (a redelivery or a republished copy adds one)."""
        self._turn = asyncio.Lock()
        self._held_changed = asyncio.Event()
        self._stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._expiry: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, channel: AbstractChannel, tenant: str, name: str, handler: Handler, on_missed: OnMissed,
                    *, window: float, max_length: int, expires: float) -> DurableConsumer:
        """Declare (idempotently) the queue and its lost-letters queue, bind it, and start consuming."""
        consumer = cls(channel, handler, on_missed, Resequencer(window=window))
        expiry = {"x-expires": round(expires * 1000), "x-overflow": "drop-head"}
        lost_name = consumer_lost_queue(tenant, name)
        lost_exchange = await channel.declare_exchange(lost_name, aio_pika.ExchangeType.FANOUT, durable=True)
        lost = await channel.declare_queue(lost_name, durable=True, arguments={
            **expiry, "x-max-length": LOST_KEPT * max_length})
        await lost.bind(lost_exchange)
        queue = await channel.declare_queue(consumer_queue(tenant, name), durable=True, arguments={
            **expiry, "x-max-length": max_length, "x-dead-letter-exchange": lost_name})
        await queue.bind(EVENTS_EXCHANGE, tenant_pattern(tenant))
        consumer._expiry = asyncio.create_task(consumer._expire_held())
        await lost.consume(consumer._on_lost)
        await queue.consume(consumer._on_delivery)
        return consumer

    async def join(self) -> None:
        """Wait until the consumer stops: returns after ``close``, raises what stopped it otherwise."""
        await asyncio.shield(self._stopped)

    async def close(self) -> None:
        """Stop consuming; what was not acknowledged yet stays in the queue for the next start."""
        await self._stop(None)

    async def __aenter__(self) -> DurableConsumer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _on_delivery(self, message: AbstractIncomingMessage) -> None:
        event = await self._read(message)
        if event is not None:
            self._deliveries.setdefault(event.event_id, []).append(message)
            await self._take(lambda now: self._resequencer.offer(event, now))

    async def _on_lost(self, message: AbstractIncomingMessage) -> None:
        event = await self._read(message)
        if event is not None:
            await self._take(lambda now: self._resequencer.lost(event, now))
            await _ack(message)

    async def _read(self, message: AbstractIncomingMessage) -> Envelope | None:
        try:
            return decode(message.body)
        except PoisonMessage as e:
            logger.warning("skipped an event this client cannot read (message %s): %s", message.message_id, e)
            await _ack(message)
            return None

    async def _take(self, decide: Callable[[float], list[Step]]) -> None:
        """Decide and act on the steps in one turn, so steps of different deliveries never interleave."""
        async with self._turn:
            if self._stopped.done():
                return
            try:
                for step in decide(time.monotonic()):
                    await self._act(step)
            except Exception as e:  # the handler's, or on_missed's: stop, leave the rest unacknowledged
                logger.exception("a durable consumer's handler or on_missed failed: stopping it")
                await self._stop(e)
            self._held_changed.set()

    async def _act(self, step: Step) -> None:
        if isinstance(step, Deliver):
            await self._handler(step.event)
            await self._acknowledge(step.event)
        elif isinstance(step, Repeat):
            await self._acknowledge(step.event)
        else:
            reported = self._on_missed(step)
            if inspect.isawaitable(reported):
                await reported
            if isinstance(step, Late):
                await self._acknowledge(step.event)

    async def _acknowledge(self, event: Envelope) -> None:
        for message in self._deliveries.pop(event.event_id, ()):
            await _ack(message)

    async def _expire_held(self) -> None:
        """Gives up on missing predecessors once the window has passed (no delivery may come to do it)."""
        while not self._stopped.done():
            deadline = self._resequencer.next_deadline()
            self._held_changed.clear()
            try:
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                await asyncio.wait_for(self._held_changed.wait(), timeout)
            except TimeoutError:
                await self._take(self._resequencer.expire)

    async def _stop(self, error: BaseException | None) -> None:
        if self._stopped.done():
            return
        if error is None:
            self._stopped.set_result(None)
        else:
            self._stopped.set_exception(error)
        if self._expiry is not None and self._expiry is not asyncio.current_task():
            self._expiry.cancel()
        await self._channel.close()  # hands every unacknowledged delivery back to the queue


async def _ack(message: AbstractIncomingMessage) -> None:
    try:
        await message.ack()
    except (aio_pika.exceptions.AMQPError, aio_pika.exceptions.ChannelInvalidStateError, ConnectionError) as e:
        # Taken on a channel that has since closed: the broker delivers it again, and it is then a repeat.
        logger.debug("could not acknowledge message %s: %r", message.message_id, e)
