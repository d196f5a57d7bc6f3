"""A create the broker nacks is sent again, unchanged, with growing waits, then reported: the
client's create path (``Client._publish``) against an exchange that nacks as a full ingress queue does.
The retry's clock and sleep are a fake one (``Clock``), so each wait is the one asked for, whatever the
machine's load."""

from __future__ import annotations

import json

import aio_pika
import pytest
from aiormq.exceptions import DeliveryError, PublishError
from pamqp.commands import Basic

from longrun_client import Backoff, Client, PublishNotConfirmed, make, retry


class Clock:
    """The retry's ``time.monotonic`` and ``asyncio.sleep``: a sleep moves the time on by what it was asked."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(retry, "time", fake)
    monkeypatch.setattr(retry, "asyncio", fake)
    return fake


class NackingExchange:
    """Nacks the first ``nacks`` publishes (``None``: every one), confirms the rest; keeps what was sent
    and when, by ``clock``."""

    def __init__(self, nacks: int | None, clock: Clock) -> None:
        self.nacks = nacks
        self.clock = clock
        self.sent: list[tuple[float, aio_pika.Message]] = []

    async def publish(self, message: aio_pika.Message, routing_key: str, *, mandatory: bool) -> None:
        assert routing_key == "run.create" and mandatory
        self.sent.append((self.clock.now, message))
        if self.nacks is None or len(self.sent) <= self.nacks:
            raise DeliveryError(None, Basic.Nack(delivery_tag=len(self.sent)))


class ReturningExchange(NackingExchange):
    async def publish(self, message: aio_pika.Message, routing_key: str, *, mandatory: bool) -> None:
        self.sent.append((self.clock.now, message))
        returned = Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="longrun.ingress",
                                routing_key=routing_key)
        raise PublishError(type("Delivered", (), {"delivery": returned})(), returned)


def _client(exchange: NackingExchange, backoff: Backoff) -> Client:
    return Client(None, exchange, None, producer="tests", keep_finished=10,  # type: ignore[arg-type]
                  user_id="guest", nack_backoff=backoff)


def _create() -> object:
    return make("run.create", {"workflow": "steps", "idempotency_key": "k-1", "input": {"steps": 1}},
                producer="tests", tenant_id="acme")


async def test_a_nacked_create_is_sent_again_unchanged_after_growing_waits_until_confirmed(clock: Clock) -> None:
    exchange = NackingExchange(nacks=4, clock=clock)
    backoff = Backoff(first=0.02, factor=2, longest=0.08, give_up_after=5)
    request = _create()
    await _client(exchange, backoff)._publish(request)  # type: ignore[arg-type]
    # Sent five times: four nacks, then the confirm
    assert len(exchange.sent) == 5
    # each time the same message: the same event id (the message id too) and idempotency key
    bodies = [json.loads(message.body) for _, message in exchange.sent]
    assert {b["event_id"] for b in bodies} == {request.event_id}  # type: ignore[attr-defined]
    assert {b["payload"]["idempotency_key"] for b in bodies} == {"k-1"}
    assert {message.message_id for _, message in exchange.sent} == {request.event_id}  # type: ignore[attr-defined]
    # after waits that double up to the longest, each jittered down to no less than half
    nominal = [0.02, 0.04, 0.08, 0.08]
    assert len(clock.waits) == len(nominal)
    for wait, most in zip(clock.waits, nominal, strict=True):
        assert most / 2 <= wait <= most, (clock.waits, nominal)
    # and each resend went right after its wait
    gaps = [b - a for (a, _), (b, _) in zip(exchange.sent, exchange.sent[1:], strict=False)]
    assert gaps == pytest.approx(clock.waits)


async def test_a_create_still_nacked_when_the_time_is_up_is_reported_not_confirmed(clock: Clock) -> None:
    exchange = NackingExchange(nacks=None, clock=clock)
    backoff = Backoff(first=0.02, longest=0.05, give_up_after=0.3)
    started = clock.now
    with pytest.raises(PublishNotConfirmed, match=r"nacked \d+ time\(s\).*ingress queue is at its bound"):
        await _client(exchange, backoff)._publish(_create())  # type: ignore[arg-type]
    # Sent again while the waits fitted in the time given, and given up before a wait would pass it:
    # the waits ran to at least the time less the longest wait, never beyond it.
    took = clock.now - started
    assert backoff.give_up_after - backoff.longest <= took <= backoff.give_up_after, clock.waits
    assert len(exchange.sent) == len(clock.waits) + 1 >= 7
    assert len({message.message_id for _, message in exchange.sent}) == 1


async def test_a_create_returned_unroutable_is_reported_at_once_without_sending_it_again(clock: Clock) -> None:
    exchange = ReturningExchange(nacks=None, clock=clock)
    with pytest.raises(PublishNotConfirmed, match="returned unroutable"):
        await _client(exchange, Backoff(give_up_after=5))._publish(_create())  # type: ignore[arg-type]
    assert len(exchange.sent) == 1
    assert clock.waits == []


def test_a_backoff_that_could_not_wait_is_refused() -> None:
    with pytest.raises(ValueError, match="first <= longest"):
        Backoff(first=3, longest=2)
