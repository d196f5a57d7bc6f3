"""The probe server answers Prometheus' scrape at /metrics beside /healthz and /readyz, on the
configured address only."""

from __future__ import annotations

import asyncio

import pytest

from longrun import metrics
from longrun.config import Settings
from longrun.errors import ConfigError
from longrun.service import Health


async def _get(port: int, path: str) -> tuple[str, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    response = await reader.read()
    writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return head.decode(), body


async def test_metrics_are_served_with_the_probes() -> None:
    health = Health()
    server = await health.serve("127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        metrics.LEASE_EXPIRIES.inc()
        head, body = await _get(port, "/metrics")
        assert head.startswith("HTTP/1.1 200") and "Content-Type: text/plain; version=0.0.4" in head
        assert b"# TYPE longrun_lease_expiries_total counter" in body
        assert b"longrun_metrics_collector 0.0" in body  # no collector lease held here
        assert (await _get(port, "/readyz"))[0].startswith("HTTP/1.1 503")
        health.ready = True
        assert (await _get(port, "/readyz"))[0].startswith("HTTP/1.1 200")
    finally:
        server.close()


async def test_the_server_listens_on_the_configured_address_only() -> None:
    server = await Health().serve("127.0.0.1", 0)
    try:
        assert {s.getsockname()[0] for s in server.sockets} == {"127.0.0.1"}
    finally:
        server.close()


def test_bind_address_and_tenant_label_settings_are_checked() -> None:
    settings = Settings.from_env({"LONGRUN_HEALTH_BIND": "10.0.0.5", "LONGRUN_METRICS_TENANT_LABEL": "true"})
    assert (settings.health_bind, settings.metrics_tenant_label, settings.metrics_interval) == ("10.0.0.5", True, 15)
    assert Settings.from_env({}).health_bind == "0.0.0.0" and not Settings.from_env({}).metrics_tenant_label
    with pytest.raises(ConfigError, match="LONGRUN_METRICS_TENANT_LABEL"):
        Settings.from_env({"LONGRUN_METRICS_TENANT_LABEL": "yes please"})
    with pytest.raises(ConfigError, match="LONGRUN_HEALTH_BIND"):
        Settings.from_env({"LONGRUN_HEALTH_BIND": " "})
