"""Bus.publish_many against the real broker: a round goes out as one write, and each message still
gets its own outcome, in order."""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import pytest

from longrun.bus.connection import Bus
from longrun.errors import BusUnavailable, Unroutable
from tests.infra import Infra

pytestmark = pytest.mark.integration


def _message(body: bytes) -> aio_pika.Message:
    return aio_pika.Message(body=body, message_id=uuid.uuid4().hex, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)


async def _bound_queue(infra: Infra, name: str) -> tuple[aio_pika.abc.AbstractConnection, aio_pika.abc.AbstractQueue]:
    """An exchange whose key "to-queue" reaches one queue, and no other key anything."""
    connection = await aio_pika.connect(infra.amqp_url)
    channel = await connection.channel()
    exchange = await channel.declare_exchange(name, "direct", auto_delete=True)
    queue = await channel.declare_queue(name, exclusive=True)
    await queue.bind(exchange, "to-queue")
    return connection, queue


async def _drain(queue: aio_pika.abc.AbstractQueue, n: int) -> list[aio_pika.abc.AbstractIncomingMessage]:
    got = []
    async with asyncio.timeout(10):
        while len(got) < n:
            message = await queue.get(fail=False)
            if message is None:
                await asyncio.sleep(0.02)
                continue
            await message.ack()
            got.append(message)
    return got


async def test_each_message_of_a_round_gets_its_own_outcome_in_order(infra: Infra, bus: Bus) -> None:
    name = f"tests.publish.{uuid.uuid4().hex[:8]}"
    connection, queue = await _bound_queue(infra, name)
    try:
        # Larger than the negotiated frame_max (128 KiB): sent as several body frames.
        large = bytes(range(256)) * 1200
        round_one = [(name, "to-queue", _message(b"first")), (name, "nobody", _message(b"unroutable")),
                     (name, "to-queue", _message(large)), (name, "to-queue", _message(b"last"))]
        results = await bus.publish_many(round_one)
        assert results[0] is None and results[2] is None and results[3] is None
        assert isinstance(results[1], Unroutable)
        # The channel's delivery tags stay in step with the broker's: a second round confirms too.
        again = await bus.publish_many([(name, "to-queue", _message(f"again-{i}".encode())) for i in range(50)])
        assert again == [None] * 50
        bodies = [m.body for m in await _drain(queue, 53)]
        assert bodies == [b"first", large, b"last", *(f"again-{i}".encode() for i in range(50))]
        assert bus.connected
    finally:
        await connection.close()


async def test_a_round_whose_channel_the_broker_closes_fails_every_message_and_reports_the_bus_lost(
        bus: Bus) -> None:
    # A publish to a missing exchange makes the broker close the channel (404): every confirm of
    # the round is then failed by the channel's close, none is left waiting for PUBLISH_TIMEOUT.
    started = asyncio.get_running_loop().time()
    results = await bus.publish_many([("longrun.events", "run.event", _message(b"x")),
                                      (f"tests.missing.{uuid.uuid4().hex[:8]}", "k", _message(b"y")),
                                      ("longrun.events", "run.event", _message(b"z"))])
    assert asyncio.get_running_loop().time() - started < 5
    assert isinstance(results[1], BusUnavailable) and isinstance(results[2], BusUnavailable)
    assert not bus.connected
    await bus.ensure_connected()
    assert await bus.publish_many([("longrun.events", "run.event", _message(b"again"))]) == [None]


async def test_a_nacked_publish_is_reported_and_the_publishing_channel_replaced(infra: Infra, bus: Bus) -> None:
    # Given a queue that refuses what exceeds one message (the broker nacks the publish)
    name = f"tests.nack.{uuid.uuid4().hex[:8]}"
    connection = await aio_pika.connect(infra.amqp_url)
    channel = await connection.channel()
    queue = await channel.declare_queue(name, exclusive=True, arguments={"x-max-length": 1,
                                                                        "x-overflow": "reject-publish"})
    try:
        before = bus._publish_channel  # noqa: SLF001 - which channel publishes is what is asserted
        # When two messages go to it in one round
        results = await bus.publish_many([("", name, _message(b"kept")), ("", name, _message(b"refused"))])
        # Then the first is confirmed, the second reported unconfirmed (its publisher sends it again),
        # and the channel that nacked is replaced while the connection stays
        assert results[0] is None
        assert isinstance(results[1], BusUnavailable)
        assert bus.connected and bus._publish_channel is not before  # noqa: SLF001
        assert before is not None and before.is_closed
        # and once there is room the same message is confirmed on the new channel
        await _drain(queue, 1)
        assert await bus.publish_many([("", name, _message(b"refused"))]) == [None]
    finally:
        await connection.close()
