"""Fixtures that run the demo's real Starlette apps under uvicorn on 127.0.0.1.

Each app gets its own thread and event loop, like a separate process, so the tests talk
to it only over HTTP; ``wait_for`` polls a condition against a deadline instead of sleeping.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette


class Served:
    """One app listening on a free port until ``stop``."""

    def __init__(self, app: Starlette) -> None:
        # IPPROTO_TCP spelled out: asyncio only sets TCP_NODELAY on sockets that say so, and
        # without it Nagle + delayed ACK add ~40 ms to every request.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"{self.url}/healthz did not answer within 10 s")

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._server.should_exit = True
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "server did not stop"


@pytest.fixture
def serve() -> Iterator[Callable[[Starlette], Served]]:
    started: list[Served] = []

    def start(app: Starlette) -> Served:
        started.append(Served(app))
        return started[-1]

    yield start
    for served in started:
        served.stop()


async def wait_for(probe: Callable[[], Awaitable[Any]], *, timeout: float = 10.0) -> Any:
    """Poll ``probe`` until it returns something truthy; fail once ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        result = await probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s (last: {result!r})")
        await asyncio.sleep(0.02)


@pytest.fixture
def poll() -> Callable[..., Awaitable[Any]]:
    return wait_for
