"""Restate (server from the npm package bench/restate pins, Python SDK) running the same workload.

The orchestrator (``bench.peers.restate``) starts ``restate-server`` with the configuration
``server_config`` writes (loopback, free ports, a data directory of its own) and this module
twice, as two processes: ``serve`` hosts the SDK's endpoint (a workflow of K ``ctx.run`` steps)
in hypercorn, in process; ``drive`` registers that endpoint with the server and calls the workflow
through the server's ingress: a lone run's latency, then M runs with N in flight. Writes one JSON
object.

Durability, as longrun's (a committed PostgreSQL transaction per step before the next): the SDK
returns a ``ctx.run`` result only when the server has echoed the step's journal entry back, which
it does once the partition processor has read it from the log (Bifrost); the log here is the
replicated loglet on this node's log-server (replication 1, one node), whose RocksDB write-ahead
log is fsynced with every write batch (``rocksdb-disable-wal-fsync = false``, set explicitly
below). Batches group the appends waiting together, as PostgreSQL's group commit does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tomllib
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import ROOT, percentiles
from bench.report import dig

PACKAGE_DIR = ROOT / "bench" / "restate"
SERVICE = "steps"


def binary() -> Path | None:
    """The server binary the pinned npm package installs for this platform (``make bench``)."""
    system = {"Linux": "linux", "Darwin": "darwin"}.get(platform.system())
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
    if system is None or arch is None:
        return None
    exe = PACKAGE_DIR / "node_modules" / "@restatedev" / f"restate-server-{system}-{arch}" / "bin" / "restate-server"
    return exe if exe.exists() else None


def server_config(*, fabric_port: int, ingress_port: int, admin_port: int) -> str:
    """The server's TOML configuration: loopback TCP only, no telemetry, and the log's durability
    spelled out (these are 1.7's defaults; written here so the comparison does not hang on them)."""
    return f"""\
cluster-name = "longrun-bench"
node-name = "bench"
listen-mode = "tcp"
bind-address = "127.0.0.1:{fabric_port}"
advertised-address = "http://127.0.0.1:{fabric_port}/"
disable-telemetry = true
log-filter = "warn"
log-disable-ansi-codes = true

[bifrost]
default-provider = "replicated"

[log-server]
rocksdb-disable-wal-fsync = false

[ingress]
bind-address = "127.0.0.1:{ingress_port}"

[admin]
bind-address = "127.0.0.1:{admin_port}"
disable-web-ui = true
"""


def effective_durability(exe: Path, config_file: Path) -> dict[str, Any]:
    """What the server says it runs with (``--dump-config``): where the journal goes, how many copies,
    whether the log's write-ahead log is written and fsynced."""
    dump = subprocess.run([str(exe), "--config-file", str(config_file), "--dump-config"], capture_output=True,
                          text=True, timeout=60, check=True).stdout
    config = tomllib.loads(dump)
    log_server = config.get("log-server", {})
    return {"bifrost.default-provider": dig(config, "bifrost", "default-provider"),
            "default-replication": config.get("default-replication"),
            "log-server.rocksdb-disable-wal": log_server.get("rocksdb-disable-wal", False),
            "log-server.rocksdb-disable-wal-fsync": log_server.get("rocksdb-disable-wal-fsync")}


def server_argv(exe: Path, *, config_file: Path, base_dir: Path) -> list[str]:
    return [str(exe), "--config-file", str(config_file), "--base-dir", str(base_dir)]


try:
    import restate
    from restate import Workflow, WorkflowContext

    steps = Workflow(SERVICE)

    async def trivial(i: int) -> int:
        return i

    @steps.main()
    async def run(ctx: WorkflowContext, k: int) -> int:  # the handler's name is the function's
        for i in range(k):
            await ctx.run_typed(f"step-{i}", trivial, i=i)
        return k

    app = restate.app(services=[steps])
except ImportError:  # the `bench` extra is not installed; the orchestrator reports it
    pass


async def serve(port: int) -> None:
    """The SDK's endpoint in this process (hypercorn's workers would fork processes the bench
    would have to count apart); HTTP/2 without TLS, as the server speaks to it."""
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.loglevel = "WARNING"
    config.accesslog = None
    await hypercorn_serve(app, config)


async def drive(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    out: dict[str, Any] = {"version": _version()}
    limits = httpx.Limits(max_connections=args.inflight, max_keepalive_connections=args.inflight)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:
        await _register(client, args.admin, args.deployment, timeout=60)
        ingress = args.ingress.rstrip("/")

        async def one(prefix: str) -> None:
            answer = await client.post(f"{ingress}/{SERVICE}/{prefix}-{uuid.uuid4()}/run", json=args.steps)
            if answer.status_code != 200 or answer.json() != args.steps:
                raise RuntimeError(f"workflow answered {answer.status_code}: {answer.text[:300]}")

        await _first_call(one, timeout=30)  # the ingress learns the new deployment asynchronously
        lone = []
        for _ in range(args.lone):
            t0 = time.perf_counter()
            await one("lone")
            lone.append((time.perf_counter() - t0) * 1000)
        out["lone_ms"] = percentiles(lone[1:] or lone)

        window = asyncio.Semaphore(args.inflight)

        async def in_window() -> None:
            async with window:
                await one("wf")

        cpu0, t0 = os.times(), time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(in_window() for _ in range(args.workflows))), timeout=args.timeout)
        elapsed = time.perf_counter() - t0
        cpu1 = os.times()
        out["throughput"] = {
            "workflows": args.workflows, "inflight": args.inflight, "seconds": round(elapsed, 2),
            "workflows_per_s": round(args.workflows / elapsed, 1),
            "steps_per_s": round(args.workflows * args.steps / elapsed, 1),
            "client_process_cpu_pct": round(100 * (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / elapsed, 1)}
    return out


async def _register(client: Any, admin: str, deployment: str, *, timeout: float) -> None:
    """Register the SDK's endpoint once both the admin API and the endpoint answer."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            answer = await client.post(f"{admin.rstrip('/')}/deployments", json={"uri": deployment})
            if answer.status_code in (200, 201):
                return
            last = f"{answer.status_code}: {answer.text[:300]}"
        except Exception as e:  # not listening yet
            last = f"{e.__class__.__name__}: {e}"
        await asyncio.sleep(0.5)
    raise RuntimeError(f"could not register {deployment} with the Restate admin API: {last}")


async def _first_call(one: Any, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await one("warm")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def _version() -> str:
    from importlib.metadata import version

    package = json.loads((PACKAGE_DIR / "package.json").read_text())["dependencies"]["@restatedev/restate-server"]
    return f"restate-server {package}, restate-sdk {version('restate-sdk')}, hypercorn {version('hypercorn')}"


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    serve_args = sub.add_parser("serve", help="host the SDK's endpoint")
    serve_args.add_argument("--port", type=int, required=True)
    drive_args = sub.add_parser("drive", help="register the endpoint and call the workflow")
    drive_args.add_argument("--ingress", required=True)
    drive_args.add_argument("--admin", required=True)
    drive_args.add_argument("--deployment", required=True)
    drive_args.add_argument("--steps", type=int, default=3)
    drive_args.add_argument("--inflight", type=int, default=64)
    drive_args.add_argument("--workflows", type=int, default=1000)
    drive_args.add_argument("--lone", type=int, default=30)
    drive_args.add_argument("--timeout", type=float, default=240)
    drive_args.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.role == "serve":
        asyncio.run(serve(args.port))
        return
    Path(args.out).write_text(json.dumps(asyncio.run(drive(args))))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
