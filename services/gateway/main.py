"""gateway service: serves webhooks and the operator API over HTTP (uvicorn, in this process's loop)."""

from __future__ import annotations

import asyncio

import uvicorn

from longrun import service
from longrun.bootstrap import keep_connected, open_bus, open_database, watch
from longrun.config import Settings
from services.gateway.http import create_app

SERVICE = "gateway"


async def serve(settings: Settings, stopping: asyncio.Event, health: service.Health) -> None:
    engine = await open_database(settings)
    bus = await open_bus(settings, SERVICE)
    # log_config=None: uvicorn's records go to the process's handler (``longrun.logs``), JSON like the rest.
    config = uvicorn.Config(create_app(engine, bus, settings), host="0.0.0.0", port=settings.gateway_port,
                            log_level=settings.log_level.lower(), lifespan="off", log_config=None)
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    reconnecting = asyncio.create_task(keep_connected(bus))
    watch(health, engine=engine, bus=bus)
    health.ready = True
    await stopping.wait()
    server.should_exit = True
    await task
    reconnecting.cancel()
    await asyncio.gather(reconnecting, return_exceptions=True)
    await bus.close()
    await engine.dispose()


def main() -> None:
    service.run(SERVICE, serve)
