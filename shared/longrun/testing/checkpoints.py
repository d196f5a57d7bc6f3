"""Points where a test may stop a task running the engine in memory, and crash it there.

Every call the in-memory store answers, and every far-side request and answer, first awaits
``checkpoint(name)``. A task run under a ``Turnstile`` (``Turnstile.run``) stops at each one until
its test lets it ``step`` on, so a test interleaves workers, operators and timers at every point
where a process could die or another writer slip in; a task run without one passes straight through.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from contextvars import ContextVar
from typing import Any

_TURNSTILE: ContextVar[Turnstile | None] = ContextVar("longrun_turnstile", default=None)


async def checkpoint(name: str) -> None:
    turnstile = _TURNSTILE.get()
    if turnstile is not None:
        await turnstile.wait_here(name)


class Crashed(BaseException):
    """A crash point reached in memory: like SIGKILL, nothing of the task's own handling runs (it is
    no ``Exception``), and whatever it had not written is lost."""


class CrashAt:
    """``Worker(crash_points=...)`` in memory: raise ``Crashed`` the ``nth`` time ``name`` is reached."""

    def __init__(self, name: str | None = None, nth: int = 1) -> None:
        self.name = name
        self.nth = nth
        self.reached: list[str] = []

    def __call__(self, name: str) -> None:
        self.reached.append(name)
        if name == self.name and self.reached.count(name) == self.nth:
            raise Crashed(name)


class Turnstile:
    """One task stepped checkpoint by checkpoint on the caller's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, Any]) -> None:
        self.loop = loop
        self.at: str | None = None
        self._arrived = asyncio.Event()
        self._go = asyncio.Event()
        self.task = loop.create_task(self._run(work))
        self._wait_for_arrival()

    async def _run(self, work: Coroutine[Any, Any, Any]) -> Any:
        _TURNSTILE.set(self)  # the task's own context: tasks it starts inherit it
        try:
            return await work
        finally:
            self.at = None
            self._arrived.set()

    async def wait_here(self, name: str) -> None:
        self.at = name
        self._arrived.set()
        await self._go.wait()
        self._go.clear()

    @property
    def done(self) -> bool:
        return self.task.done()

    def step(self) -> bool:
        """Let the task run to its next checkpoint (or its end); False once it has ended."""
        if self.done:
            return False
        self._go.set()
        self._wait_for_arrival()
        return not self.done

    def kill(self) -> None:
        """SIGKILL: the task stops where it waits; nothing after that point runs."""
        if not self.done:
            self.task.cancel()
            self.loop.run_until_complete(asyncio.gather(self.task, return_exceptions=True))

    def _wait_for_arrival(self) -> None:
        self._arrived.clear()
        arrived = self.loop.create_task(self._arrived.wait())
        self.loop.run_until_complete(asyncio.wait({arrived, self.task}, return_when=asyncio.FIRST_COMPLETED))
        arrived.cancel()
        self.loop.run_until_complete(asyncio.gather(arrived, return_exceptions=True))
