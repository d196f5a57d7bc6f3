"""One AMQP connection per process: topology at start, confirmed publishing, reconnects.

We manage reconnection ourselves instead of relying on robust-connection state
recovery (whose consumer restore has regressed repeatedly): when the connection
drops, ``lost`` is set, and the owner rebuilds channels and consumers after
``ensure_connected`` succeeds again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import aio_pika
import aiormq
from aiormq.abc import ChannelFrame
from pamqp import commands as amqp
from pamqp.header import ContentHeader
from aio_pika.abc import AbstractChannel, AbstractConnection
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential_jitter

from longrun import faults
from longrun.bus.topology import Topology
from longrun.errors import BusUnavailable, InfrastructureUnreachable, Unroutable

logger = logging.getLogger(__name__)

START_HINT = ("start RabbitMQ (on Debian: rabbitmq-server -detached) or point LONGRUN_AMQP_URL "
              "at a running broker")
PUBLISH_TIMEOUT = 10.0
CONNECT_TIMEOUT = 30.0
CONNECTION_ERRORS = (aiormq.exceptions.AMQPError, ConnectionError, OSError, asyncio.TimeoutError,
                     aio_pika.exceptions.ChannelInvalidStateError)
# The broker refusing our topology (declared with other arguments) or our permissions.
CONFIGURATION_ERRORS = (aiormq.exceptions.ChannelPreconditionFailed, aiormq.exceptions.ChannelAccessRefused)


def node_urls(url: str) -> list[str]:
    """One URL per node of ``amqp://user:pass@host1:5672,host2:5672/vhost``: a cluster's nodes in
    one address, the credentials, vhost and options shared. A single host gives itself."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("amqp", "amqps"):
        raise ValueError(f"expected an amqp:// or amqps:// URL, got {_redact(url)!r}")
    authority, slash, tail = rest.partition("/")
    credentials, at, hosts = authority.rpartition("@")
    nodes = [h.strip() for h in hosts.split(",")]
    if not all(nodes):
        raise ValueError(f"a node's host is empty in {_redact(url)!r}")
    return [f"{scheme}://{credentials}{at}{host}{slash}{tail}" for host in nodes]


class Bus:
    def __init__(self, url: str, *, topology: Topology, name: str, heartbeat: int = 10) -> None:
        """``url`` may name several nodes of a cluster (``node_urls``): a connection goes to the one
        that answers, starting with the last that did."""
        self.url = url
        self.nodes = node_urls(url)
        self._node = 0
        self.heartbeat = heartbeat
        self.topology = topology
        self.name = name
        self.connection: AbstractConnection | None = None
        self._publish_channel: AbstractChannel | None = None
        self._reopening = asyncio.Lock()
        self.lost = asyncio.Event()

    @property
    def connected(self) -> bool:
        # A connection dropped by the broker is not ``is_closed`` in aio-pika; the
        # close callback (``lost``) and the channel state are what tell.
        return (self.connection is not None and not self.lost.is_set()
                and self._publish_channel is not None and not self._publish_channel.is_closed)

    async def connect(self) -> None:
        """Connect, declare the topology, open the confirm channel: all of it or nothing, within
        CONNECT_TIMEOUT. A drop midway, or a queue still recovering after a broker restart ("home
        node ... is down or inaccessible"), is InfrastructureUnreachable like a refused connect, so
        ``ensure_connected`` retries it instead of ending the task that reconnects."""
        try:
            await asyncio.wait_for(self._open(), timeout=CONNECT_TIMEOUT)
        except CONFIGURATION_ERRORS:
            raise  # retrying cannot help
        except (*CONNECTION_ERRORS, RuntimeError) as e:  # aio-pika: RuntimeError on a dropped connection
            raise InfrastructureUnreachable(
                f"RabbitMQ is not reachable at {_redact(self.url)}: {e.__class__.__name__}: {e}. "
                f"To fix: {START_HINT}") from e

    async def _open(self) -> None:
        connection = await self._connect_to_a_node()
        try:
            channel = await _publishing_channel(connection)
            await declare(channel, self.topology)
            if channel.is_closed:  # dropped after the last reply: its close callbacks have already run
                raise ConnectionError("the connection dropped while it was being opened")
        except BaseException:
            await _close_quietly(connection)
            raise
        # No await from here on: the connection is adopted whole, and from now on a drop sets ``lost``.
        connection.close_callbacks.add(self._on_close)
        self.connection, self._publish_channel = connection, channel
        self.lost.clear()

    async def _connect_to_a_node(self) -> AbstractConnection:
        """The first node that accepts, in order from the last one that did; a dead or paused node
        (a minority's nodes close their listeners) refuses at once, so this costs little."""
        error: BaseException | None = None
        for offset in range(len(self.nodes)):
            index = (self._node + offset) % len(self.nodes)
            try:
                # A short heartbeat lets the broker drop a frozen replica's connection, so
                # single-active-consumer hands its partitions to a live one.
                connection = await aio_pika.connect(
                    self.nodes[index], client_properties={"connection_name": self.name},
                    timeout=10 if len(self.nodes) == 1 else 5, heartbeat=self.heartbeat)
            except (*CONNECTION_ERRORS, RuntimeError) as e:
                error = e
                continue
            if index != self._node:
                logger.warning("connected to RabbitMQ node %d of %d: %s", index + 1, len(self.nodes),
                               _redact(self.nodes[index]))
            self._node = index
            return connection
        assert error is not None
        raise error

    async def ensure_connected(self) -> None:
        """Reconnect with jittered backoff until the broker answers."""
        if self.connected:
            return
        await self._discard()
        async for attempt in AsyncRetrying(retry=retry_if_exception_type(InfrastructureUnreachable),
                                           wait=wait_exponential_jitter(multiplier=0.2, max=5),
                                           reraise=True):
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    logger.warning("reconnecting to RabbitMQ (attempt %d)", attempt.retry_state.attempt_number)
                await self.connect()

    def _on_close(self, *_: object) -> None:
        self.lost.set()

    async def channel(self, *, prefetch: int) -> AbstractChannel:
        assert self.connection is not None
        channel = await self.connection.channel(publisher_confirms=False)
        await channel.set_qos(prefetch_count=prefetch)
        return channel

    async def publish(self, exchange: str, routing_key: str, message: aio_pika.Message) -> None:
        """Publish and wait for the broker's confirm; an unroutable message is an error."""
        results = await self.publish_many([(exchange, routing_key, message)])
        if isinstance(results[0], BaseException):
            raise results[0]

    async def publish_many(
        self, items: Sequence[tuple[str, str, aio_pika.Message]]
    ) -> list[BaseException | None]:
        """Confirmed publishing on one channel, in order, awaiting the confirms together; one result
        per item (None: confirmed)."""
        if not self.connected or self._publish_channel is None:
            error = BusUnavailable("not connected to RabbitMQ")
            return [error for _ in items]
        try:
            channel = await self._publish_channel.get_underlay_channel()
            if not faults.protected("publisher-confirms"):
                await _send_unconfirmed(channel, items)
                return [None for _ in items]
            confirmations = await _send_together(channel, items)
        except (*CONNECTION_ERRORS, RuntimeError) as e:
            error = BusUnavailable(f"publishing {len(items)} message(s) failed: {e!r}")
            results: list[BaseException | None] = [error for _ in items]
        else:
            await asyncio.wait(confirmations, timeout=PUBLISH_TIMEOUT)
            results = [_result(c, exchange, routing_key) for c, (exchange, routing_key, _) in zip(
                confirmations, items, strict=True)]
            if any(_nacked(c) for c in confirmations):
                await self._reopen_publish_channel(channel)
        if any(isinstance(r, BusUnavailable) for r in results) and not self.connected:
            self.lost.set()
        return results

    async def _reopen_publish_channel(self, nacking: aiormq.abc.AbstractChannel) -> None:
        """RabbitMQ 3.10 can nack every publish, indefinitely, on a channel opened while a quorum
        queue's leader was failing over, while a fresh channel works: after a nack the channel is
        replaced (once, however many publishers saw it nack). The nacked messages were reported
        unconfirmed; their publishers send them again."""
        async with self._reopening:
            current = self._publish_channel
            if current is None or self.connection is None or await current.get_underlay_channel() is not nacking:
                return
            logger.warning("RabbitMQ nacked a publish: replacing the publishing channel")
            try:
                self._publish_channel = await _publishing_channel(self.connection)
            except (*CONNECTION_ERRORS, RuntimeError) as e:
                logger.warning("replacing the publishing channel failed: %r", e)
                self.lost.set()
                return
            try:
                await asyncio.wait_for(current.close(), timeout=2)
            except (*CONNECTION_ERRORS, RuntimeError) as e:
                logger.debug("closing the nacking channel: %r", e)

    async def _discard(self) -> None:
        """Forget a broken connection (best effort: the broker may already have dropped it)."""
        connection, self.connection, self._publish_channel = self.connection, None, None
        self.lost.set()
        if connection is not None:
            connection.close_callbacks.discard(self._on_close)
            await _close_quietly(connection)

    async def close(self) -> None:
        if self.connection is not None and not self.connection.is_closed:
            await self.connection.close()


async def _publishing_channel(connection: AbstractConnection) -> AbstractChannel:
    """Confirms on and unroutable messages returned as errors (unless a fault test switched confirms off)."""
    confirms = faults.protected("publisher-confirms")
    return await connection.channel(publisher_confirms=confirms, on_return_raises=confirms)


async def _close_quietly(connection: AbstractConnection) -> None:
    """Best effort: the broker may already have dropped it."""
    try:
        await asyncio.wait_for(connection.close(), timeout=2)
    except Exception as e:
        logger.debug("closing a broken connection: %r", e)


async def declare(channel: AbstractChannel, topology: Topology) -> None:
    """Idempotent: declaring what exists with the same arguments changes nothing."""
    for spec in topology.exchanges:
        await channel.declare_exchange(spec.name, spec.type, durable=spec.durable, arguments=spec.arguments)
    for queue in topology.queues:
        await channel.declare_queue(queue.name, durable=True, arguments=queue.arguments)
    for binding in topology.bindings:
        queue_obj = await channel.get_queue(binding.queue, ensure=False)
        await queue_obj.bind(binding.exchange, routing_key=binding.routing_key)


async def _send_together(channel: aiormq.abc.AbstractChannel,
                         items: Sequence[tuple[str, str, aio_pika.Message]]) -> list[asyncio.Future[Any]]:
    """What aiormq's ``basic_publish`` does for one message (a delivery tag and a confirmation
    future each, the message id kept to match a return), for all of ``items``, with their frames
    written to the socket as one: a write per message cost the relay ~0.1 ms of CPU per message
    and RabbitMQ ~0.06 (docs/cost-model.md, fix 30). Mandatory: an unroutable message is returned."""
    if channel.is_closed:
        raise aiormq.exceptions.ChannelInvalidStateError(f"{channel!r} closed")
    frames: list[Any] = []
    confirmations: list[asyncio.Future[Any]] = []
    async with channel.lock:
        first_tag = channel.delivery_tag
        for exchange, routing_key, message in items:
            channel.delivery_tag += 1
            tag = channel.delivery_tag
            message_id = message.message_id or uuid.uuid4().hex
            properties = message.properties
            properties.message_id = message_id
            confirmation = channel.create_future()
            channel.confirmations[tag] = confirmation
            channel.message_id_delivery_tag[message_id] = tag
            confirmation.add_done_callback(functools.partial(_forget, channel, message_id, tag))
            confirmations.append(confirmation)
            frames += [amqp.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True),
                       ContentHeader(properties=properties, body_size=len(message.body)),
                       *channel._split_body(message.body)]  # noqa: SLF001 - frame_max-sized body frames
        try:
            await channel.write_queue.put(ChannelFrame.marshall(frames=frames, channel_number=channel.number))
        except BaseException:
            # The broker has seen none of them: their tags are free again, as in ``basic_publish``.
            channel.delivery_tag = first_tag
            for tag, confirmation in enumerate(confirmations, start=first_tag + 1):
                channel.confirmations.pop(tag, None)
                confirmation.cancel()
            raise
    return confirmations


async def _send_unconfirmed(channel: aiormq.abc.AbstractChannel,
                            items: Sequence[tuple[str, str, aio_pika.Message]]) -> None:
    """``_send_together`` without confirms, as a publisher that trusts the socket would: only for a
    fault test that shows what the confirms protect (``LONGRUN_PROTECTIONS_OFF``)."""
    frames: list[Any] = []
    for exchange, routing_key, message in items:
        frames += [amqp.Basic.Publish(exchange=exchange, routing_key=routing_key),
                   ContentHeader(properties=message.properties, body_size=len(message.body)),
                   *channel._split_body(message.body)]  # noqa: SLF001 - frame_max-sized body frames
    async with channel.lock:
        await channel.write_queue.put(ChannelFrame.marshall(frames=frames, channel_number=channel.number))


def _forget(channel: aiormq.abc.AbstractChannel, message_id: str, tag: int, _: asyncio.Future[Any]) -> None:
    if channel.message_id_delivery_tag.get(message_id) == tag:
        channel.message_id_delivery_tag.pop(message_id)


def _nacked(confirmation: asyncio.Future[Any]) -> bool:
    """The broker refused the message (a return, for an unroutable one, is not a nack)."""
    if not confirmation.done() or confirmation.cancelled():
        return False
    error = confirmation.exception()
    return isinstance(error, aiormq.exceptions.DeliveryError) and not isinstance(error, aiormq.exceptions.PublishError)


def _result(confirmation: asyncio.Future[Any], exchange: str, routing_key: str) -> BaseException | None:
    if not confirmation.done():
        confirmation.cancel()
        return BusUnavailable(f"publish to {exchange}/{routing_key}: no confirm within {PUBLISH_TIMEOUT}s")
    if confirmation.cancelled():
        return BusUnavailable(f"publish to {exchange}/{routing_key} failed: the channel closed")
    error = confirmation.exception()
    if error is None:
        return None
    if isinstance(error, aiormq.exceptions.PublishError):
        logger.error("unroutable: %s", error)
        return Unroutable(exchange, routing_key)
    return BusUnavailable(f"publish to {exchange}/{routing_key} failed: {error!r}")


def _redact(url: str) -> str:
    if "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    return f"{scheme}://***@{rest.split('@', 1)[1]}"
