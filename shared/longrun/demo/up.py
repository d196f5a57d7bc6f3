"""``make run``: bring the whole ensemble up on this machine and run one agent task end to end.

Starts the forge/CI stand-in and every service as separate processes (logs in
var/logs/), waits until each reports ready, publishes ``run.create`` on the ingress
exchange with longrun-client exactly as an external producer would, and prints the run's timeline live —
state changes, actions with idempotency keys and receipts, waits and what woke them —
acting as the approver when the run asks. It ends when the run reaches a terminal
state, then checks the forge: the merge request must exist exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from longrun_client import Client
from sqlalchemy import text

from longrun.config import Settings
from longrun.db.engine import make_engine
from longrun.demo.timeline import describe
from longrun.domain import TERMINAL, RunStatus

SERVICES = [("gateway", "services.gateway"), ("scheduler", "services.scheduler"), ("worker-0", "services.worker"),
            ("worker-1", "services.worker"), ("timer", "services.timer"), ("reconciler", "services.reconciler"),
            ("outbox-relay", "services.outbox_relay")]


class Ports:
    def __init__(self, base: int) -> None:
        self.gateway, self.forge, self.health = base, base + 10, base + 100


class Ensemble:
    def __init__(self, root: Path, settings: Settings, ports: Ports) -> None:
        self.ports = ports
        self.logs = root / "var" / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.settings = settings
        self.procs: list[tuple[str, subprocess.Popen[bytes], int | None]] = []

    def env(self, **extra: str) -> dict[str, str]:
        env = {"LONGRUN_TOOL_TIMEOUT": "3", **os.environ}
        env.update({"LONGRUN_FORGE_URL": f"http://127.0.0.1:{self.ports.forge}",
                    "LONGRUN_GATEWAY_PORT": str(self.ports.gateway), **extra})
        return env

    def start(self, name: str, argv: list[str], health_port: int | None, **env: str) -> None:
        log = (self.logs / f"{name}.log").open("wb")
        extra = {"LONGRUN_INSTANCE_ID": name, **env}
        if health_port:
            extra["LONGRUN_HEALTH_PORT"] = str(health_port)
        proc = subprocess.Popen(argv, env=self.env(**extra), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append((name, proc, health_port))

    async def ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=1) as http:
            for name, proc, port in self.procs:
                url = f"http://127.0.0.1:{port}/readyz" if port else f"http://127.0.0.1:{self.ports.forge}/healthz"
                while True:
                    if proc.poll() is not None:
                        raise SystemExit(f"{name} exited with {proc.returncode}; see {self.logs / name}.log")
                    try:
                        if (await http.get(url)).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise SystemExit(f"{name} not ready after {timeout:.0f}s; see {self.logs / name}.log")
                    await asyncio.sleep(0.2)
                print(f"  up   {name:<13} pid {proc.pid}")

    def stop(self) -> None:
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc, _ in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


async def publish_run_create(settings: Settings, key: str, goal: dict[str, Any]) -> None:
    async with await Client.connect(settings.amqp_url, producer="make-run") as client:
        envelope = await client.create_run("acme", "dependency_upgrade", goal, idempotency_key=key, priority=5)
    print(f"  published run.create {envelope.event_id} (tenant acme, idempotency key {key})")


async def follow(settings: Settings, ports: Ports, key: str, deadline: float) -> str:
    """Print every event as it is stored; approve when asked; return the final status."""
    engine = make_engine(settings.database_url, pool_size=2)
    seen, run_id, status = 0, None, ""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports.gateway}", timeout=10) as gateway:
        while time.monotonic() < deadline:
            async with engine.connect() as conn:
                if run_id is None:
                    run_id = (await conn.execute(text(
                        "SELECT run_id FROM runs WHERE tenant_id = 'acme' AND idempotency_key = :k"),
                        {"k": key})).scalar()
                    if run_id:
                        print(f"  run {run_id}\n")
                rows = [] if run_id is None else (await conn.execute(text(
                    "SELECT seq, type, data, applied, occurred_at FROM run_events WHERE run_id = :r AND seq > :s "
                    "ORDER BY seq"), {"r": run_id, "s": seen})).all()
                status = (await conn.execute(text("SELECT status FROM runs WHERE run_id = :r"),
                                             {"r": run_id})).scalar() or ""
            for row in rows:
                print(describe(row.seq, row.type, row.data, row.applied, row.occurred_at))
                seen = row.seq
                if row.type == "run.wait_started" and row.data["status"] == RunStatus.WAITING_USER.value:
                    await approve(gateway, settings, run_id, row.data["wait"])
            if status and RunStatus(status) in TERMINAL and not rows:
                break
            await asyncio.sleep(0.1)
    await engine.dispose()
    return status


async def approve(gateway: httpx.AsyncClient, settings: Settings, run_id: str | None, wait: dict[str, Any]) -> None:
    print(f"         -> {wait['owner']} reviews {wait['subject']!r} and approves hash {wait['approved_hash'][:12]}")
    response = await gateway.post(
        f"/runs/{run_id}/approve", json={"approval_id": wait["approval_id"], "approved_hash": wait["approved_hash"],
                                         "reason": "diff, tests and cost reviewed"},
        headers={"authorization": f"Bearer {settings.operator_tokens[0]}", "x-operator": wait["owner"]})
    response.raise_for_status()


async def main_async(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    root = Path.cwd()
    ports = Ports(args.port_base)
    ensemble = Ensemble(root, settings, ports)
    print("longrun: starting the ensemble")
    (ensemble.logs.parent / "forge.sqlite").unlink(missing_ok=True)
    ensemble.start("forge", [sys.executable, "-m", "longrun.demo.forge", "--port", str(ports.forge),
                             "--state", str(ensemble.logs.parent / "forge.sqlite"), "--ci-delay", "0.5"], None)
    for i, (name, module) in enumerate(SERVICES):
        ensemble.start(name, [sys.executable, "-m", module], ports.health + i)
    try:
        await ensemble.ready()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports.forge}") as forge:
            # The CI reports through a signed webhook, delivered twice: the gateway inbox absorbs the repeat.
            (await forge.post("/_control/webhook", json={
                "url": f"http://127.0.0.1:{ports.gateway}/webhooks/forge", "secret": settings.webhook_secret,
                "deliver_times": 2})).raise_for_status()
            if args.mr_timeout:
                (await forge.post("/_control/faults", json={"endpoint": "merge_requests",
                                                            "mode": "timeout_after_commit", "times": 1,
                                                            "hold_seconds": 8})).raise_for_status()
        key = args.key or f"upgrade-payment-sdk-{uuid.uuid4().hex[:8]}"
        goal = {"repo": "acme/payments", "package": "payment-sdk", "from": "4.2.0", "to": "5.0.0",
                "branch": f"agent/payment-sdk-v5-{key[-8:]}", "owner": "user_42"}
        print("\nlongrun: timeline")
        await publish_run_create(settings, key, goal)
        status = await follow(settings, ports, key, time.monotonic() + args.timeout)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports.forge}") as forge:
            effects = (await forge.get("/_control/effects")).json()
        mrs = [e for e in effects if e["kind"] == "merge_request"]
        print(f"\nlongrun: run ended {status}; forge effects: "
              + ", ".join(f"{e['kind']}×{e['count']}" for e in effects))
        created = sum(e["count"] for e in mrs)
        print(f"longrun: merge requests created for this run: {created}")
        return 0 if status == RunStatus.COMPLETED.value and created == 1 else 1
    finally:
        if not args.keep:
            ensemble.stop()
            print("longrun: services stopped (logs in var/logs/)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the run to finish")
    parser.add_argument("--key", help="idempotency key of the run.create (default: a new one)")
    parser.add_argument("--mr-timeout", action=argparse.BooleanOptionalAction, default=True,
                        help="the forge times out after creating the merge request, so the action goes UNKNOWN "
                             "and the reconciler settles it by idempotency key (the story of seed 004)")
    parser.add_argument("--keep", action="store_true", help="leave the services running afterwards")
    parser.add_argument("--port-base", type=int, default=8280,
                        help="gateway on this port, forge on +10, health probes from +100")
    raise SystemExit(asyncio.run(main_async(parser.parse_args())))


if __name__ == "__main__":
    main()
