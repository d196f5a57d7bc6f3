"""Create runs and follow them over RabbitMQ, as any producer would: no database, no runtime code.

For ``accepted``, ``wait`` and ``events`` a tenant's events reach the client through one queue of
its own bound to ``<tenant>.run.#`` on the events exchange, before the first create of that tenant
is published, so the answer to a create cannot be missed. That queue is exclusive (it goes away
with the connection): events published while the client is disconnected do not reach it.
``consume`` reads a named durable queue instead (``longrun_client.consumer``), which keeps them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractIncomingMessage, AbstractRobustConnection
from opentelemetry import trace

from longrun_client.bus import (CONSUMER_NAME_PATTERN, CREATE_KEY, EVENTS_EXCHANGE, INGRESS_EXCHANGE,
                                TENANT_PATTERN, tenant_pattern)
from longrun_client.codec import broker_user, to_message
from longrun_client.consumer import DurableConsumer, Handler, OnMissed
from longrun_client.errors import PoisonMessage
from longrun_client.model import Envelope
from longrun_client.payloads import BudgetLimits, RunCreateV4, RunOutcomeV3, RunScope, RunSignalV1, RunTimeouts
from longrun_client.pending import PendingCreate, correlation_id_of
from longrun_client.registry import decode, make, traceparent
from longrun_client.retry import Backoff, publish_confirmed
from longrun_client.stream import EventStream

__all__ = ["Client"]

logger = logging.getLogger(__name__)
Listener = Callable[[Envelope], None]


class Client:
    """One AMQP connection: ``create_run``, then ``accepted`` / ``wait`` for it, or ``events`` of a tenant.

    Use ``async with await Client.connect(url) as client:`` (or call ``close``). Not thread-safe:
    one event loop.
    """

    def __init__(self, connection: AbstractRobustConnection, ingress: AbstractExchange,
                 consumer: AbstractChannel, *, producer: str, keep_finished: int, user_id: str,
                 nack_backoff: Backoff = Backoff()) -> None:
        self._connection = connection
        self._nack_backoff = nack_backoff
        self._user_id = user_id
        self._ingress = ingress
        self._consumer = consumer
        self._producer = producer
        self._keep_finished = keep_finished
        self._listeners: dict[str, set[Listener]] = {}
        self._subscribing = asyncio.Lock()
        self._pending: dict[str, PendingCreate] = {}
        self._latest: dict[str, str] = {}
        self._finished: deque[str] = deque()
        self._streams: set[EventStream] = set()
        self._durable: set[DurableConsumer] = set()

    @classmethod
    async def connect(cls, url: str, *, producer: str = "longrun-client", keep_finished: int = 1000,
                      connection_name: str | None = None, nack_backoff: Backoff = Backoff()) -> Client:
        """Connect (reconnecting on its own afterwards) and check the ingress exchange exists.

        ``producer`` names this client in every envelope it sends; ``keep_finished`` is how many
        finished creates ``accepted`` and ``wait`` still answer for after their run ended. Every
        create carries the URL's user as its ``user_id``: longrun admits it only in the tenants
        that broker user is allowed. The broker lists the connection under ``connection_name``
        (default: ``longrun-client <producer>``). A create the broker nacks (the ingress queue is at
        its bound, or a node fails over) is sent again as ``nack_backoff`` says (by default for up
        to 30 s, waits from 50 ms doubling up to 2 s)."""
        connection = await aio_pika.connect_robust(url, client_properties={
            "connection_name": connection_name or f"longrun-client {producer}"})
        try:
            publisher = await connection.channel(publisher_confirms=True, on_return_raises=True)
            ingress = await publisher.get_exchange(INGRESS_EXCHANGE)
            consumer = await connection.channel()
        except BaseException:
            await connection.close()
            raise
        return cls(connection, ingress, consumer, producer=producer, keep_finished=keep_finished,
                   user_id=broker_user(url), nack_backoff=nack_backoff)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """End every subscription; ``accepted``/``wait`` still waiting raise ConnectionError."""
        for stream in list(self._streams):
            stream.close()
        for consumer in self._durable:
            await consumer.close()
        for pending in self._pending.values():
            pending.close()
        await self._connection.close()

    async def create_run(self, tenant: str, workflow: str, input: Mapping[str, Any], *, idempotency_key: str,
                         labels: Mapping[str, str] | None = None, priority: int = 5,
                         budget: BudgetLimits | Mapping[str, Any] | None = None, workflow_version: str | None = None,
                         correlation_id: str | None = None, scope: RunScope | Mapping[str, Any] | None = None,
                         deadline: datetime | None = None,
                         timeouts: RunTimeouts | Mapping[str, Any] | None = None) -> Envelope:
        """Publish a run.create and return it once the broker has confirmed it. A nacked create is
        sent again, unchanged, with backoff (``Client.connect``'s ``nack_backoff``), then reported
        with ``PublishNotConfirmed``.

        ``scope`` narrows what the run may do (it never widens what its kind and tenant allow);
        ``deadline`` (timezone-aware): if the run is still open then, it is cancelled for it and ends
        TIMED_OUT; ``timeouts`` sets its schedule-to-start and start-to-close (else its kind's defaults).

        The same (tenant, idempotency_key) makes one run however often it is sent, so sending again
        after a ``PublishNotConfirmed`` or a lost connection is safe. The payload is validated here
        first (pydantic ``ValidationError``). With an OpenTelemetry SDK installed a producer span is
        started and the envelope carries its traceparent, so the run's trace starts here."""
        payload = RunCreateV4.model_validate({
            "workflow": workflow, "idempotency_key": idempotency_key, "input": dict(input),
            "priority": priority, "budget": budget if budget is not None else BudgetLimits(),
            "workflow_version": workflow_version, "labels": dict(labels or {}), "scope": scope,
            "deadline": deadline, "timeouts": timeouts})
        listeners = await self._subscribe(tenant)
        tracer = trace.get_tracer("longrun_client")
        caller = traceparent()  # what the envelope carries when the tracer is a no-op (no SDK installed)
        with tracer.start_as_current_span(f"send {INGRESS_EXCHANGE}", kind=trace.SpanKind.PRODUCER, attributes={
                "messaging.system": "rabbitmq", "messaging.operation.type": "send",
                "messaging.destination.name": INGRESS_EXCHANGE,
                "messaging.rabbitmq.destination.routing_key": CREATE_KEY}) as span:
            request = make("run.create", payload, producer=self._producer, tenant_id=tenant,
                           correlation_id=correlation_id, trace=traceparent() or caller)
            span.set_attribute("messaging.message.id", request.event_id)
            span.set_attribute("messaging.message.conversation_id", correlation_id_of(request))
            pending = self._expect(request, listeners)
            try:
                await self._publish(request)
            except BaseException:
                listeners.discard(pending.offer)
                self._forget(request.event_id)
                raise
        return request

    async def signal_run(self, tenant: str, run_id: str, name: str, payload: Any = None, *, signal_id: str,
                         correlation_id: str | None = None) -> Envelope:
        """Publish a run.signal to the run (of ``tenant``) and return it once the broker has confirmed
        it, sent again on a nack as ``create_run`` is. The run's kind must declare ``name``, and
        ``payload`` (default ``{}``) satisfy its schema; the same ``signal_id`` is recorded once per
        run, so sending again after a ``PublishNotConfirmed`` or a lost connection is safe. A refusal
        comes back as run.rejected on the tenant's events (``refused_event_id``: this envelope's
        ``event_id``)."""
        signal = RunSignalV1.model_validate({"signal_id": signal_id, "name": name,
                                             "payload": {} if payload is None else payload})
        request = make("run.signal", signal, producer=self._producer, tenant_id=tenant, run_id=run_id,
                       correlation_id=correlation_id)
        await self._publish(request)
        return request

    async def accepted(self, request: Envelope | str, *, timeout: float | None = 30.0) -> Envelope:
        """The run.accepted answering a create this client sent (the envelope, or its correlation id:
        then the latest create with it). Its payload names the run and its pinned versions;
        ``repeated`` is True when the key had made that run before.

        Raises RunRejected (with the run.rejected payload) if the create was refused, TimeoutError
        if no answer came in time."""
        pending = self._find(request)
        await _within(pending.answer, timeout, f"no answer to run.create {pending.request.event_id}")
        return pending.accepted()

    async def wait(self, request: Envelope | str, *, timeout: float | None) -> RunOutcomeV3:
        """How the run a create made ended: the terminal run.event's outcome (status, reason,
        acceptance evidence, receipts). ``timeout`` None waits as long as it takes.

        A repeated create of a run that had already ended is answered at once: its run.accepted
        carries the outcome. Raises RunRejected if the create was refused, TimeoutError if the run did not end in time."""
        pending = self._find(request)
        await _within(pending.end, timeout, f"the run of run.create {pending.request.event_id} did not end")
        return pending.outcome()

    async def events(self, tenant: str, *, run_id: str | None = None,
                     correlation_id: str | None = None) -> EventStream:
        """Subscribe to a tenant's events (of one run, or of the creates with one correlation id) from
        now on. Iterate the result with ``async for``; close it (or ``async with`` it) to stop.

        Each event comes once (deduplicated by event_id), a run's status events in seq order: one
        arriving after a later one is dropped, not held back (see ``longrun_client.sequence``), and
        what is published while the connection is down is missed; ``consume`` has neither limit."""
        stream = EventStream(await self._subscribe(tenant), run_id=run_id, correlation_id=correlation_id,
                             on_close=self._streams.discard)
        self._streams.add(stream)
        return stream

    async def consume(self, tenant: str, handler: Handler, *, name: str, on_missed: OnMissed,
                      window: float = 5.0, max_length: int = 100_000, expires: float = 7 * 24 * 3600.0,
                      prefetch: int = 1000) -> DurableConsumer:
        """Hand the tenant's events to ``handler`` through the durable queue named ``name``, from
        where the consumer of that name stopped (its queue keeps what is published meanwhile).

        Each event is handed on once (by event_id) and a run's events in seq order: one arriving
        before its predecessor is held back up to ``window`` seconds. What cannot be handed on is
        given to ``on_missed`` (sync or async): a ``Gap`` (events that will not come: dropped past
        ``max_length``, or not arrived within the window) or a ``Late`` event (after its gap).
        The queue expires ``expires`` seconds after its last consumer went away; ``prefetch``
        bounds the deliveries taken at once (held ones count). Changing ``max_length`` or
        ``expires`` of an existing name is refused by the broker (PRECONDITION_FAILED)."""
        if not re.fullmatch(TENANT_PATTERN, tenant):
            raise ValueError(f"tenant id {tenant!r} does not match {TENANT_PATTERN}")
        if not re.fullmatch(CONSUMER_NAME_PATTERN, name):
            raise ValueError(f"consumer name {name!r} does not match {CONSUMER_NAME_PATTERN}")
        channel = await self._connection.channel()
        try:
            await channel.set_qos(prefetch_count=prefetch)
            consumer = await DurableConsumer.start(channel, tenant, name, handler, on_missed, window=window,
                                                   max_length=max_length, expires=expires)
        except BaseException:
            await channel.close()
            raise
        self._durable.add(consumer)
        return consumer

    async def _subscribe(self, tenant: str) -> set[Listener]:
        if not re.fullmatch(TENANT_PATTERN, tenant):
            raise ValueError(f"tenant id {tenant!r} does not match {TENANT_PATTERN}")
        async with self._subscribing:
            if tenant not in self._listeners:
                # Named here, not by the server: a robust connection redeclares it after a reconnect.
                # The tenant comes first: a tenant's broker user may declare only queues named so.
                queue = await self._consumer.declare_queue(f"{tenant}.longrun-client.{uuid.uuid4().hex}",
                                                           exclusive=True)
                await queue.bind(EVENTS_EXCHANGE, tenant_pattern(tenant))
                listeners: set[Listener] = set()
                await queue.consume(functools.partial(self._deliver, listeners), no_ack=True)
                self._listeners[tenant] = listeners
            return self._listeners[tenant]

    async def _deliver(self, listeners: set[Listener], message: AbstractIncomingMessage) -> None:
        try:
            event = decode(message.body)
        except PoisonMessage as e:
            logger.warning("skipped an event this client cannot read (message %s): %s", message.message_id, e)
            return
        for listener in tuple(listeners):
            listener(event)

    def _expect(self, request: Envelope, listeners: set[Listener]) -> PendingCreate:
        pending = PendingCreate(request)
        self._pending[request.event_id] = pending
        self._latest[correlation_id_of(request)] = request.event_id
        listeners.add(pending.offer)
        pending.end.add_done_callback(lambda _: self._done(pending, listeners))
        return pending

    def _done(self, pending: PendingCreate, listeners: set[Listener]) -> None:
        """A finished create stops listening; the oldest finished beyond ``keep_finished`` are forgotten."""
        listeners.discard(pending.offer)
        self._finished.append(pending.request.event_id)
        while len(self._finished) > self._keep_finished:
            self._forget(self._finished.popleft())

    def _forget(self, event_id: str) -> None:
        correlation = correlation_id_of(self._pending.pop(event_id).request)
        if self._latest.get(correlation) == event_id:
            del self._latest[correlation]

    def _find(self, request: Envelope | str) -> PendingCreate:
        if isinstance(request, Envelope):
            pending, named = self._pending.get(request.event_id), f"run.create {request.event_id}"
        else:
            pending = self._pending.get(self._latest.get(request, ""))
            named = f"run.create with correlation id {request!r}"
        if pending is None:
            raise LookupError(f"this client knows no {named}: it sent none, or forgot it among more than "
                              f"{self._keep_finished} finished ones")
        return pending

    async def _publish(self, request: Envelope) -> None:
        """On the ingress, under its type as the routing key (``run.create``, ``run.signal``)."""
        key = request.type
        message = to_message(request, user_id=self._user_id)
        await publish_confirmed(lambda: self._ingress.publish(message, routing_key=key, mandatory=True),
                                exchange=INGRESS_EXCHANGE, routing_key=key, backoff=self._nack_backoff,
                                what=f"{request.type} {request.event_id}")


async def _within(future: asyncio.Future[Envelope | None], timeout: float | None, what: str) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(future), timeout)
    except TimeoutError:
        raise TimeoutError(f"{what} within {timeout} s") from None
