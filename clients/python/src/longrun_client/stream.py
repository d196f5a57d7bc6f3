"""A subscription to a tenant's events, as an async iterator."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType

from longrun_client.model import Envelope
from longrun_client.sequence import Sequencer

__all__ = ["EventStream"]


class EventStream:
    """The events of one tenant (or one run, or one correlation id) from the moment it was made.

    Deliveries are filtered as they arrive (``Sequencer``: each once, a run's in seq order) and
    buffered until iterated, without a bound: iterate, or close the stream."""

    def __init__(self, listeners: set[Callable[[Envelope], None]], *, run_id: str | None,
                 correlation_id: str | None, on_close: Callable[[EventStream], None]) -> None:
        self._listeners = listeners
        self._sequencer = Sequencer(run_id=run_id, correlation_id=correlation_id)
        self._buffer: asyncio.Queue[Envelope | None] = asyncio.Queue()
        self._on_close = on_close
        self._closed = False
        listeners.add(self._offer)

    def _offer(self, event: Envelope) -> None:
        if self._sequencer.admit(event):
            self._buffer.put_nowait(event)

    def close(self) -> None:
        """Stop listening; iteration ends once what was already buffered has been taken."""
        if not self._closed:
            self._closed = True
            self._listeners.discard(self._offer)
            self._buffer.put_nowait(None)
            self._on_close(self)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Envelope:
        event = await self._buffer.get()
        if event is None:
            self._buffer.put_nowait(None)
            raise StopAsyncIteration
        return event

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()
