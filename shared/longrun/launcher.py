"""Every longrun service as a process on this machine, for demos and local runs: the database
migrated, each service started with logs in ``var/logs/``, waited for until it reports ready,
stopped together; and a run's timeline printed live from its stored events (``longrun.timeline``)
until it ends.

``python -m longrun.launcher`` runs the ensemble with whatever run kinds are installed or configured
(``--help``); the dependency-upgrade example's ``make run`` (``longrun_dependency_upgrade.demo``) is
built on it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, NoReturn

import httpx
from sqlalchemy import text

from longrun.config import Settings
from longrun.db.engine import make_engine
from longrun.domain import TERMINAL, RunStatus
from longrun_client.timeline import describe

SERVICES = [("gateway", "longrun.services.gateway"), ("scheduler", "longrun.services.scheduler"), ("worker-0", "longrun.services.worker"),
            ("worker-1", "longrun.services.worker"), ("timer", "longrun.services.timer"), ("reconciler", "longrun.services.reconciler"),
            ("outbox-relay", "longrun.services.outbox_relay")]
"""One of each service, and two workers."""

OnEvent = Callable[[str, str, dict[str, Any]], Awaitable[None]]
"""Called with (run id, event type, event data) for each event as it is printed."""


class Launcher:
    def __init__(self, root: Path, *, gateway_port: int, health_base: int, env: dict[str, str]) -> None:
        """Health probes on ``health_base`` and up, one port per service; ``env`` for every process."""
        self.logs = root / "var" / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.gateway_port = gateway_port
        self.health_base = health_base
        self.base_env = {"LONGRUN_GATEWAY_PORT": str(gateway_port), **env}
        self.procs: list[tuple[str, subprocess.Popen[bytes], str]] = []

    def migrate(self) -> None:
        """The database created if missing and migrated to head, before any service needs it."""
        with (self.logs / "migrate.log").open("wb") as log:
            done = subprocess.run([sys.executable, "-m", "longrun.db.migrate", "upgrade"],
                                  env={**os.environ, **self.base_env}, stdout=log, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            raise SystemExit(f"migrations failed with {done.returncode}; see {self.logs / 'migrate.log'}")
        print("  up   database      migrated")

    def start(self, name: str, argv: list[str], ready_url: str, **env: str) -> None:
        """A process whose ``ready_url`` answers 200 once it is ready."""
        log = (self.logs / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, env={**os.environ, **self.base_env, "LONGRUN_INSTANCE_ID": name, **env},
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, proc, ready_url))

    def start_services(self) -> None:
        for i, (name, module) in enumerate(SERVICES):
            port = self.health_base + i
            self.start(name, [sys.executable, "-m", module], f"http://127.0.0.1:{port}/readyz",
                       LONGRUN_HEALTH_PORT=str(port))

    async def ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=1) as http:
            for name, proc, url in self.procs:
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

    async def watch(self) -> NoReturn:
        """Until one of the processes exits, which is then named."""
        while True:
            for name, proc, _ in self.procs:
                if proc.poll() is not None:
                    raise SystemExit(f"{name} exited with {proc.returncode}; see {self.logs / name}.log")
            await asyncio.sleep(1)

    def stop(self) -> None:
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc, _ in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


async def follow(settings: Settings, tenant: str, key: str, deadline: float, on_event: OnEvent | None = None) -> str:
    """Print every event of the run (tenant, idempotency key) as it is stored, until it ends or the
    deadline passes; return its last status."""
    engine = make_engine(settings.database_url, pool_size=2)
    seen, run_id, status = 0, None, ""
    try:
        while time.monotonic() < deadline:
            async with engine.connect() as conn:
                if run_id is None:
                    run_id = (await conn.execute(text(
                        "SELECT run_id FROM runs WHERE tenant_id = :t AND idempotency_key = :k"),
                        {"t": tenant, "k": key})).scalar()
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
                if on_event is not None and run_id is not None:
                    await on_event(run_id, row.type, row.data)
            if status and RunStatus(status) in TERMINAL and not rows:
                break
            await asyncio.sleep(0.1)
    finally:
        await engine.dispose()
    return status


def run_stoppable(main: Coroutine[Any, Any, int]) -> NoReturn:
    """Exit with ``main``'s code. SIGINT or SIGTERM cancels it instead, so that its ``finally`` stops
    the services (they run in sessions of their own: no signal reaches them otherwise)."""
    async def cancellable() -> int:
        task = asyncio.current_task()
        assert task is not None
        for signum in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signum, task.cancel)
        return await main

    try:
        raise SystemExit(asyncio.run(cancellable()))
    except asyncio.CancelledError:
        raise SystemExit(130) from None


async def main_async(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    launcher = Launcher(Path.cwd(), gateway_port=args.port_base, health_base=args.port_base + 100, env={})
    print("longrun: starting the ensemble")
    launcher.migrate()
    launcher.start_services()
    try:
        await launcher.ready()
        if args.key is None:
            print(f"longrun: every service is up, the gateway on port {args.port_base}; Ctrl-C or SIGTERM stops them")
            await launcher.watch()
        print(f"\nlongrun: timeline of {args.tenant}/{args.key}")
        status = await follow(settings, args.tenant, args.key, time.monotonic() + args.timeout)
        print(f"\nlongrun: run ended {status or 'not created'}")
        return 0 if status == RunStatus.COMPLETED.value else 1
    finally:
        launcher.stop()
        print("longrun: services stopped (logs in var/logs/)")


def main() -> None:
    parser = argparse.ArgumentParser(description="Migrate the database and run every longrun service on this "
                                                 "machine; with --key, print that run's timeline until it ends.")
    parser.add_argument("--tenant", default="acme", help="the tenant of the run to follow")
    parser.add_argument("--key", help="the idempotency key of the run to follow (default: none, run until Ctrl-C)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to follow the run")
    parser.add_argument("--port-base", type=int, default=8280, help="gateway on this port, health probes from +100")
    run_stoppable(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
