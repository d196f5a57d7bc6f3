"""The real ensemble for engine tests: forge, gateway, scheduler, workers, relay (and timer/reconciler)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.bus import topology
from longrun.bus.codec import broker_user, to_message
from longrun.bus.connection import Bus
from longrun.envelope import make
from tests.fixtures import eventually
from tests.harness import SECRETS, Process, Services
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_TOKEN = SECRETS["LONGRUN_OPERATOR_TOKENS"]
WEBHOOK_SECRET = SECRETS["LONGRUN_WEBHOOK_SECRET"]
SERVICES = {"gateway": "longrun.services.gateway", "scheduler": "longrun.services.scheduler", "worker": "longrun.services.worker",
            "relay": "longrun.services.outbox_relay", "timer": "longrun.services.timer", "reconciler": "longrun.services.reconciler"}
"""Each service by the name the tests give it, and its module."""


class Ensemble:
    def __init__(self, services: Services, tmp: Path) -> None:
        self.services = services
        self.forge_port = free_port()
        self.gateway_port = free_port()
        self.forge_url = f"http://127.0.0.1:{self.forge_port}"
        self.gateway_url = f"http://127.0.0.1:{self.gateway_port}"
        self.tmp = tmp
        self.env = {"LONGRUN_FORGE_URL": self.forge_url, "LONGRUN_GATEWAY_PORT": str(self.gateway_port),
                    "LONGRUN_RUN_LEASE_TTL": "5"}

    def start_forge(self) -> Process:
        return self.services.start("forge", "longrun_dependency_upgrade.forge", argv_extra=[
            "--port", str(self.forge_port), "--state", str(self.tmp / "forge.sqlite"), "--ci-delay", "0.2"])

    def start(self, name: str, module: str, **env: str) -> Process:
        return self.services.start(name, module, **{**self.env, **env})

    def start_services(self, *names: str, **env: str) -> None:
        """The services ``names`` (of ``SERVICES``), started in that order, each with ``env``."""
        for name in names:
            self.start(name, SERVICES[name], **env)

    async def wait_http(self, url: str) -> None:
        async def answers() -> bool:
            try:
                async with httpx.AsyncClient(timeout=1) as http:
                    return (await http.get(url)).status_code == 200
            except httpx.HTTPError:
                return False

        await eventually(answers, timeout=30, what=url)

    async def configure_forge(self, *, deliver_times: int = 1, faults: tuple[dict[str, Any], ...] = ()) -> None:
        await self.wait_http(f"{self.forge_url}/healthz")
        async with httpx.AsyncClient(base_url=self.forge_url) as forge:
            (await forge.post("/_control/webhook", json={
                "url": f"{self.gateway_url}/webhooks/forge", "secret": WEBHOOK_SECRET,
                "deliver_times": deliver_times})).raise_for_status()
            for fault in faults:
                (await forge.post("/_control/faults", json=fault)).raise_for_status()

    async def forge_effects(self) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=self.forge_url) as forge:
            return (await forge.get("/_control/effects")).json()  # type: ignore[no-any-return]


def goal(tag: str) -> dict[str, Any]:
    return {"repo": "acme/payments", "package": "payment-sdk", "from": "4.2.0", "to": "5.0.0",
            "branch": f"agent/payment-sdk-v5-{tag}", "owner": "user_42"}


async def publish_create(bus: Bus, *, tenant: str, key: str, input_: dict[str, Any], priority: int = 5,
                         workflow: str = "dependency_upgrade", workflow_version: str | None = None) -> str:
    """``workflow_version``: the version the run pins (None: the newest the scheduler knows)."""
    pinned = {} if workflow_version is None else {"workflow_version": workflow_version}
    envelope = make("run.create", {"workflow": workflow, "idempotency_key": key, "input": input_,
                                   "priority": priority, **pinned}, producer="tests", tenant_id=tenant)
    await bus.publish(topology.INGRESS_EXCHANGE, "run.create", to_message(envelope, user_id=broker_user(bus.url)))
    return envelope.event_id


async def run_id_for(engine: AsyncEngine, tenant: str, key: str) -> str | None:
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT run_id FROM runs WHERE tenant_id = :t AND idempotency_key = :k"),
                                   {"t": tenant, "k": key})).scalar()


async def status_of(engine: AsyncEngine, run_id: str) -> str | None:
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT status FROM runs WHERE run_id = :r"), {"r": run_id})).scalar()


async def event_types(engine: AsyncEngine, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT type, data FROM run_events WHERE run_id = :r ORDER BY seq"),
                                  {"r": run_id})
        return [(r.type, r.data) for r in rows]


def new_key() -> str:
    return f"key-{uuid.uuid4().hex[:10]}"
