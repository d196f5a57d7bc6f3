"""DBOS Transact on the same PostgreSQL, running the same workload: workflows of K trivial steps.

Run as its own process (``python -m bench.peers_dbos``; DBOS is a process-wide singleton
with its own threads): a lone workflow's latency, then M workflows with N in flight
started directly, then M workflows through a DBOS queue (worker concurrency N, polling
every 0.1 s rather than the default 1 s, which favours DBOS). Writes one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import percentiles

QUEUE_POLL = 0.1


def build(db_url: str, inflight: int) -> Any:
    from dbos import DBOS

    DBOS(config={"name": "longrun-bench", "system_database_url": db_url, "log_level": "WARNING",
                 "sys_db_pool_size": max(20, inflight + 4)})

    @DBOS.step()
    async def trivial(i: int) -> int:
        return i

    @DBOS.workflow()
    async def steps(k: int) -> int:
        for i in range(k):
            await trivial(i)
        return k

    return DBOS, steps


async def run(args: argparse.Namespace) -> dict[str, Any]:
    DBOS, steps = build(args.db, args.inflight)
    DBOS.launch()
    out: dict[str, Any] = {"version": _version(), "queue_polling_interval_s": QUEUE_POLL}
    try:
        lone = []
        for _ in range(args.lone):
            t0 = time.perf_counter()
            handle = await DBOS.start_workflow_async(steps, args.steps)
            await handle.get_result()
            lone.append((time.perf_counter() - t0) * 1000)
        out["lone_ms"] = percentiles(lone[1:] or lone)  # the first one warms the pools

        window = asyncio.Semaphore(args.inflight)

        async def direct_one() -> None:
            async with window:
                handle = await DBOS.start_workflow_async(steps, args.steps)
                await handle.get_result()

        cpu0, t0 = os.times(), time.perf_counter()
        await asyncio.gather(*(direct_one() for _ in range(args.workflows)))
        elapsed = time.perf_counter() - t0
        out["direct"] = _rates(args, elapsed, cpu0)

        queue = await DBOS.register_queue_async(f"bench-{uuid.uuid4().hex[:6]}", worker_concurrency=args.inflight,
                                                polling_interval_sec=QUEUE_POLL)
        cpu0, t0 = os.times(), time.perf_counter()
        handles = []
        for i in range(0, args.workflows, args.inflight):  # enqueued concurrently, like a producer's burst
            handles += await asyncio.gather(*(queue.enqueue_async(steps, args.steps)
                                              for _ in range(min(args.inflight, args.workflows - i))))
        enqueued = time.perf_counter() - t0
        await asyncio.gather(*(h.get_result() for h in handles))
        elapsed = time.perf_counter() - t0
        out["queue"] = {**_rates(args, elapsed, cpu0), "enqueue_s": round(enqueued, 2)}
    finally:
        DBOS.destroy()
    return out


def _rates(args: argparse.Namespace, elapsed: float, cpu0: os.times_result) -> dict[str, Any]:
    cpu1 = os.times()
    return {"workflows": args.workflows, "inflight": args.inflight, "seconds": round(elapsed, 2),
            "workflows_per_s": round(args.workflows / elapsed, 1),
            "steps_per_s": round(args.workflows * args.steps / elapsed, 1),
            "process_cpu_pct": round(100 * (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / elapsed, 1)}


def _version() -> str:
    from importlib.metadata import version

    return version("dbos")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--workflows", type=int, default=500)
    parser.add_argument("--lone", type=int, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    Path(args.out).write_text(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
