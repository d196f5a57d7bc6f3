"""Sending a create the broker nacked again, the same message, with backoff, for a bounded time.

The broker nacks a ``run.create`` when the ingress queue is at its bound (the runtime is behind:
backpressure) or while a broker node fails over. The message is sent again unchanged (the same
event id and idempotency key), so a create that was in fact enqueued after all is deduplicated
by the runtime and makes one run, never two.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aio_pika

from longrun_client.errors import PublishNotConfirmed

__all__ = ["Backoff", "publish_confirmed"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backoff:
    """How long to wait before sending a nacked message again, and when to give up."""

    first: float = 0.05
    """Seconds before the first resend."""
    factor: float = 2.0
    """Each wait this many times the one before ..."""
    longest: float = 2.0
    """... up to this many seconds."""
    give_up_after: float = 30.0
    """Seconds from the first send after which a message still nacked is reported not confirmed."""

    def __post_init__(self) -> None:
        if not (0 < self.first <= self.longest and self.factor >= 1 and self.give_up_after >= 0):
            raise ValueError(f"expected 0 < first <= longest, factor >= 1, give_up_after >= 0; got {self}")

    def delay(self, attempt: int) -> float:
        """The wait after the ``attempt``-th send (1, 2, ...) was nacked: exponential, capped, and
        jittered down to half so that producers nacked together do not come back together."""
        return min(self.longest, self.first * self.factor ** (attempt - 1)) * random.uniform(0.5, 1.0)


async def publish_confirmed(publish: Callable[[], Awaitable[object]], *, exchange: str, routing_key: str,
                            backoff: Backoff, what: str) -> None:
    """Await ``publish`` (one confirmed publish of a message built once) until the broker confirms
    it, sending it again after each nack as ``backoff`` says. Raises PublishNotConfirmed when the
    message is returned unroutable (at once: sending again cannot help) or still nacked after
    ``backoff.give_up_after`` seconds."""
    started = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            await publish()
            return
        except aio_pika.exceptions.PublishError as e:  # a return, not a nack
            raise PublishNotConfirmed(exchange, routing_key, f"returned unroutable ({e})") from e
        except aio_pika.exceptions.DeliveryError as e:
            wait = backoff.delay(attempt)
            elapsed = time.monotonic() - started
            if elapsed + wait > backoff.give_up_after:
                raise PublishNotConfirmed(exchange, routing_key, (
                    f"nacked {attempt} time(s) in {elapsed:.1f} s: the ingress queue is at its bound (the "
                    f"runtime is behind) or a broker node is failing over; sending the same request again "
                    f"later is safe")) from e
            logger.warning("%s nacked by the broker (send %d): the ingress queue is full or failing over; "
                           "sending it again in %.2f s", what, attempt, wait)
            await asyncio.sleep(wait)
