"""The probe server: liveness answers whatever the probes say; readiness names each failing probe."""

from __future__ import annotations

import asyncio

import pytest

from longrun.service import Health


async def _get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    answer = (await reader.read()).decode()
    writer.close()
    return int(answer.split(" ")[1]), answer.split("\r\n\r\n", 1)[1]


async def test_readiness_names_what_fails_and_liveness_does_not_care(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Health, "PROBE_TIMEOUT", 0.2)
    health = Health()
    server = await health.serve("127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    up = {"broker": True}

    async def hangs() -> bool:
        await asyncio.sleep(10)
        return True

    async def raises() -> bool:
        raise ConnectionRefusedError("database down")

    try:
        # Not started yet: alive, not ready
        assert await _get(port, "/healthz") == (200, "ok\n")
        assert await _get(port, "/readyz") == (503, "not ready: not started\n")
        # Started with probes that pass: ready
        health.probe("rabbitmq", lambda: up["broker"])
        health.ready = True
        assert await _get(port, "/readyz") == (200, "ok\n")
        # A probe false, one that raises and one too slow: not ready, each named; still alive
        up["broker"] = False
        health.probe("postgresql", raises)
        health.probe("consuming", hangs)
        assert await _get(port, "/readyz") == (503, "not ready: rabbitmq, postgresql, consuming\n")
        assert await _get(port, "/healthz") == (200, "ok\n")
    finally:
        server.close()
