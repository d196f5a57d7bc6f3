"""What every service process shares: logging (``longrun.logs``), probes, signals, waiting for infrastructure.

``run(name, serve)`` loads Settings once (a config error exits 2 naming every bad
variable), arms crash points, starts the probe server (``/healthz``, ``/readyz``, and Prometheus'
``/metrics``, on ``LONGRUN_HEALTH_BIND``:``LONGRUN_HEALTH_PORT``), and runs ``serve(settings,
stopping)`` until SIGTERM/SIGINT sets ``stopping``. The event loop is uvloop's: the
services spend much of their CPU in the loop (socket reads and writes for every round
trip), and uvloop does that work in C (``make bench`` profiles show the share).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Awaitable, Callable

import uvloop

from longrun import __version__, faults, logs, metrics, otel
from longrun.config import Settings
from longrun.errors import ConfigError, InfrastructureUnreachable

logger = logging.getLogger(__name__)

Serve = Callable[[Settings, asyncio.Event, "Health"], Awaitable[None]]


Probe = Callable[[], "bool | Awaitable[bool]"]


class Health:
    """Liveness (/healthz) is the event loop answering, whatever the broker and the database do.
    Readiness (/readyz) is the service started (``ready``) and every probe it registered passing at
    the time of asking: the database answers, the bus connection is up, the consumers consume. A
    probe that fails, raises or takes longer than ``PROBE_TIMEOUT`` fails; the answer names it. The
    same small server answers Prometheus' scrapes (``/metrics``)."""

    PROBE_TIMEOUT = 2.0

    def __init__(self) -> None:
        self.ready = False
        self.probes: dict[str, Probe] = {}

    def probe(self, name: str, check: Probe) -> None:
        self.probes[name] = check

    async def failing(self) -> list[str]:
        """What keeps the service from being ready now (empty: ready)."""
        if not self.ready:
            return ["not started"]
        results = await asyncio.gather(*(self._passes(check) for check in self.probes.values()))
        return [name for name, passed in zip(self.probes, results, strict=True) if not passed]

    async def _passes(self, check: Probe) -> bool:
        try:
            result = check()
            if not isinstance(result, bool):
                result = await asyncio.wait_for(result, timeout=self.PROBE_TIMEOUT)
            return bool(result)
        except Exception as e:
            logger.debug("readiness probe failed: %r", e)
            return False

    async def serve(self, host: str, port: int) -> asyncio.Server:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            request = await reader.readline()
            path = request.split(b" ")[1] if request.count(b" ") >= 2 else b"/"
            content_type = b"text/plain"
            if path.split(b"?")[0] == b"/metrics":
                ok, body, content_type = True, metrics.exposition(), metrics.CONTENT_TYPE.encode()
            else:
                failing = await self.failing() if path == b"/readyz" else []
                ok = path == b"/healthz" or (path == b"/readyz" and not failing)
                body = b"ok\n" if ok else f"not ready: {', '.join(failing) or 'unknown path'}\n".encode()
            status = b"200 OK" if ok else b"503 Service Unavailable"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + content_type + b"\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
            await writer.drain()
            writer.close()

        return await asyncio.start_server(answer, host, port)


def run(service: str, serve: Serve) -> None:
    if sys.argv[1:] == ["--version"]:
        print(f"longrun-{service} {__version__}")
        raise SystemExit(0)
    try:
        settings = Settings.from_env()
    except ConfigError as e:
        print(f"{service}: {e}", file=sys.stderr)
        raise SystemExit(2) from e
    logs.setup(service, level=settings.log_level, format=settings.log_format)
    otel.setup(service, settings.otel_exporter)
    metrics.label_tenants(settings.metrics_tenant_label)
    faults.arm(settings.crash_points, settings.protections_off)
    # What is loaded by now (modules, classes, the schema: some 100,000 objects) lives as long as the
    # process, yet every full collection walked all of it again: 57-68 ms of CPU each under `make
    # bench`, one in a burst of 10,000 timers (5 % of the timer's CPU for it) and one per worker in an
    # ensemble phase; frozen, the collector leaves it alone (docs/cost-model.md, fix 37).
    gc.freeze()
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_main(service, settings, serve))
    except InfrastructureUnreachable as e:
        logger.error("%s cannot start: %s", service, e)
        raise SystemExit(3) from e


async def _main(service: str, settings: Settings, serve: Serve) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    health = Health()
    server = await health.serve(settings.health_bind, settings.health_port) if settings.health_port else None
    logger.info("%s starting as %s", service, settings.instance_id)
    try:
        await serve(settings, stopping, health)
    finally:
        if server is not None:
            server.close()
        logger.info("%s stopped", service)
