"""Live progress on the bus: workers publish calls' chunks and heartbeat details to the transient
fanout exchange ``longrun.progress``; every gateway replica reads all of them through an exclusive, auto-delete queue of its own, bounded
in length (the oldest dropped first), so each replica can stream any run to its followers. The same
queue takes the run events of ``longrun.events`` of the tenants whose runs someone follows on that
replica (bound ``<tenant>.run.#`` while one does), so a new event is read at once.

Why the bus and not PostgreSQL's NOTIFY: a NOTIFY payload is capped at 8,000 bytes and passes through
the database that carries every run's step; a chunk takes up to 64 KiB and never touches PostgreSQL.
Messages are non-persistent and unconfirmed: nothing here is history, a message the broker drops is a
gap the follower is told of (``longrun.domain.live_progress``).

Both sides keep a connection of their own (``aio_pika.connect_robust``, which declares the queue, its
bindings and its consumer again after a reconnect). A worker opens its connection at the first chunk
any of its calls emits, so a worker whose calls emit none never opens it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import aio_pika
import orjson
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage, AbstractQueue, AbstractRobustConnection

from longrun.bus.connection import node_urls
from longrun.bus.topology import EVENTS_EXCHANGE, PROGRESS_EXCHANGE, event_key

logger = logging.getLogger(__name__)
RETRY_AFTER = 5.0
"""Seconds a publisher that could not connect drops progress before it tries again (a call is never held up)."""
CONNECT_TIMEOUT = 5.0


class ProgressPublisher:
    """A worker's side: each message published once, non-persistent; dropped when the bus is away."""

    def __init__(self, url: str, *, name: str) -> None:
        self.url = node_urls(url)[0]
        self.name = name
        self._connection: AbstractRobustConnection | None = None
        self._exchange: AbstractExchange | None = None
        self._opening = asyncio.Lock()
        self._retry_at = 0.0

    async def send(self, message: Mapping[str, Any]) -> None:
        exchange = self._exchange or await self._open()
        if exchange is None:
            return
        try:
            await exchange.publish(aio_pika.Message(orjson.dumps(message), content_type="application/json",
                                                    delivery_mode=aio_pika.DeliveryMode.NOT_PERSISTENT),
                                   routing_key=str(message["run_id"]))
        except Exception as e:
            logger.debug("live progress of run %s dropped: %r", message.get("run_id"), e)

    async def _open(self) -> AbstractExchange | None:
        async with self._opening:
            if self._exchange is not None or time.monotonic() < self._retry_at:
                return self._exchange
            try:
                self._connection = await asyncio.wait_for(aio_pika.connect_robust(
                    self.url, client_properties={"connection_name": f"{self.name}/progress"}), CONNECT_TIMEOUT)
                channel = await self._connection.channel(publisher_confirms=False)
                self._exchange = await channel.get_exchange(PROGRESS_EXCHANGE, ensure=False)
            except Exception as e:
                self._retry_at = time.monotonic() + RETRY_AFTER
                logger.warning("live progress goes nowhere for %.0fs: the bus is not reachable (%r)", RETRY_AFTER, e)
            return self._exchange

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()


Received = Callable[[str, Mapping[str, Any]], None]
"""Called with ``progress`` or ``event`` and the message's body."""


class ProgressFeed:
    """A gateway's side: its own queue on the progress exchange and on every run event."""

    def __init__(self, url: str, *, name: str, max_length: int, received: Received) -> None:
        self.url = node_urls(url)[0]
        self.name = name
        self.max_length = max_length
        self.received = received
        self._connection: AbstractRobustConnection | None = None
        self._queue: AbstractQueue | None = None
        self._watched: Counter[str] = Counter()
        self._binding = asyncio.Lock()

    async def watch(self, tenant: str) -> None:
        """Someone follows a run of ``tenant``: its run events come too (best effort: a follower
        rereads the run's events every few seconds anyway)."""
        async with self._binding:
            self._watched[tenant] += 1
            if self._watched[tenant] == 1 and self._queue is not None:
                await self._rebind(tenant, bind=True)

    async def unwatch(self, tenant: str) -> None:
        async with self._binding:
            self._watched[tenant] -= 1
            if self._watched[tenant] <= 0:
                del self._watched[tenant]
                if self._queue is not None:
                    await self._rebind(tenant, bind=False)

    async def _rebind(self, tenant: str, *, bind: bool) -> None:
        assert self._queue is not None
        try:
            if bind:
                await self._queue.bind(EVENTS_EXCHANGE, routing_key=event_key(tenant, "#"))
            else:
                await self._queue.unbind(EVENTS_EXCHANGE, routing_key=event_key(tenant, "#"))
        except Exception as e:
            logger.warning("%s the run events of %s: %r", "could not take" if bind else "could not leave", tenant, e)

    async def start(self) -> None:
        self._connection = await aio_pika.connect_robust(
            self.url, client_properties={"connection_name": f"{self.name}/progress"})
        channel = await self._connection.channel()
        queue = await channel.declare_queue("", exclusive=True, auto_delete=True, arguments={
            "x-max-length": self.max_length, "x-overflow": "drop-head"})
        await queue.bind(PROGRESS_EXCHANGE, routing_key="#")
        await queue.consume(self._on_message, no_ack=True)
        self._queue = queue

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        try:
            body = orjson.loads(message.body)
        except orjson.JSONDecodeError:
            logger.warning("a message on %s that is not JSON was ignored", message.exchange)
            return
        if isinstance(body, dict):
            self.received("progress" if message.exchange == PROGRESS_EXCHANGE else "event", body)

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
