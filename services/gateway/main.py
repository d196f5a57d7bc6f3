"""gateway service: serves webhooks and the operator API over plain HTTP (uvicorn, in this process's
loop), on one port or, with ``LONGRUN_WEBHOOK_PORT``, the webhook intake on a port of its own. TLS
ends in front of it, at the ingress (docs/operations.md)."""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from longrun import service, webhook_providers
from longrun.bootstrap import keep_connected, open_bus, open_database, watch
from longrun.config import Settings
from longrun.db import tokens
from longrun.bus.progress import ProgressFeed
from longrun.services.gateway import live, secrets_check
from longrun.services.gateway.http import create_app

SERVICE = "gateway"
logger = logging.getLogger(__name__)


async def serve(settings: Settings, stopping: asyncio.Event, health: service.Health) -> None:
    refused = _refused_secrets(settings)
    if refused:
        for why in refused:
            logger.error("gateway cannot start: %s", why)
        raise SystemExit(2)
    engine = await open_database(settings)
    async with engine.connect() as conn:
        off = secrets_check.bootstrap_off_refusal(settings, named_tokens=await tokens.any_live(conn))
    if off is not None:
        logger.error("gateway cannot start: %s", off)
        await engine.dispose()
        raise SystemExit(2)
    bus = await open_bus(settings, SERVICE)
    apart = settings.webhook_port != 0
    hub = live.Hub(settings.progress_buffer)
    feed = ProgressFeed(settings.amqp_url, name=f"{SERVICE}/{settings.instance_id}",
                        max_length=16 * settings.progress_buffer, received=hub.received)
    await feed.start()
    hub.watcher = feed
    apps = [(create_app(engine, bus, settings, intake=not apart, hub=hub), settings.gateway_port)]
    if apart:
        apps.append((create_app(engine, bus, settings, operator_api=False), settings.webhook_port))
    # log_config=None: uvicorn's records go to the process's handler (``longrun.logs``), JSON like the rest.
    proxies = settings.forwarded_allow_ips.strip()
    servers = [uvicorn.Server(uvicorn.Config(app, host="0.0.0.0", port=port, log_level=settings.log_level.lower(),
                                             lifespan="off", log_config=None, proxy_headers=bool(proxies),
                                             forwarded_allow_ips=proxies or None)) for app, port in apps]
    for server in servers:
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    tasks = [asyncio.create_task(server.serve()) for server in servers]
    reconnecting = asyncio.create_task(keep_connected(bus))
    watch(health, engine=engine, bus=bus)
    health.ready = True
    await stopping.wait()
    for server in servers:
        server.should_exit = True
    await asyncio.gather(*tasks)
    reconnecting.cancel()
    await asyncio.gather(reconnecting, return_exceptions=True)
    await feed.close()
    await bus.close()
    await engine.dispose()


def main() -> None:
    service.run(SERVICE, serve)


def _refused_secrets(settings: Settings) -> list[str]:
    own = dict(settings.webhook_secrets)
    providers = webhook_providers.load(settings)
    lone_without_own = len(providers) == 1 and not set(providers) <= set(own)
    return secrets_check.refusals(settings, shared_webhook_secret_used=lone_without_own, provider_secrets=sorted(own))
