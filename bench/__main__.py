"""``python -m bench [--json PATH]``: every phase in one run; a table on stdout and one JSON file.

Knobs (environment): BENCH_QUICK=1 (a ~3-minute smoke run), BENCH_STEPS (K, 3),
BENCH_INFLIGHT (N, 64), BENCH_RUNS (M), BENCH_WORKERS (2), BENCH_REPLICAS ("1,2,4"),
BENCH_TIMERS (10000), BENCH_PARKED (10000), BENCH_LIMITED_CALLS (1000), BENCH_PHASES (comma list of
limits,ensemble,bare_after,retention,code_first,dbos,temporal,restate,scale,timers,recovery,waiting; and,
only when named, million (BENCH_SCALE_RUNS sizes it, 20000,1000000) and timeline), BENCH_LEASE_TTL (5),
BENCH_LOG_LEVEL (WARNING). PostgreSQL and RabbitMQ come from LONGRUN_DATABASE_URL /
LONGRUN_AMQP_URL or the local defaults; the bench uses its own database and vhost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench import ensemble, limits, peers, pruning, rate_limited, recovery, report, scale, timeline, timers
from bench.common import ROOT, CpuWatch, Knobs, loadavg, stop_all
from bench.infra import Infra, interference

PHASE_TIMEOUT = 900.0
PHASE_TIMEOUTS = {"million": 3600.0}
"""Phases allowed longer than PHASE_TIMEOUT: loading a million parked runs takes most of a quarter hour."""


def _machine(infra: Infra) -> dict[str, Any]:
    info: dict[str, Any] = {"cores": os.cpu_count(), "loadavg_start": round(loadavg(), 2)}
    idle = CpuWatch()
    idle.start()
    time.sleep(3)
    info["cpu_busy_before_start_pct"] = idle.stop()["machine"]
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        info["memory_gib"] = round(pages / 2**30, 1)
    except (ValueError, OSError):
        pass
    from sqlalchemy import create_engine

    engine = create_engine(infra.database_url)
    try:
        with engine.connect() as conn:
            info["postgres"] = conn.execute(text("SHOW server_version")).scalar()
            for setting in ("synchronous_commit", "fsync", "shared_buffers", "max_connections"):
                info[setting] = conn.execute(text(f"SHOW {setting}")).scalar()
    finally:
        engine.dispose()
    try:
        out = subprocess.run(["rabbitmqctl", "version"], capture_output=True, text=True, timeout=30)
        info["rabbitmq"] = out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        info["rabbitmq"] = None
    return info


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except OSError:
        return "?"


async def _infra_answers(engine: Any, amqp_url: str, timeout: float = 120) -> None:
    """Wait for PostgreSQL and RabbitMQ (something outside the bench may have restarted them)
    and drop pooled connections from before."""
    import aio_pika

    await engine.dispose()
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            connection = await aio_pika.connect(amqp_url, timeout=5)
            await connection.close()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)


_INFRA_ERRORS = ("OperationalError", "AMQPConnectionError", "ConnectionClosed", "ChannelInvalidStateError",
                 "InterfaceError", "AdminShutdown", "ConnectionRefusedError", "ChannelClosed")


def _infra_failure(e: BaseException) -> bool:
    """The database or the broker went away under the phase (not a finding about longrun)."""
    text_ = f"{e.__class__.__name__}: {e}"
    return any(name in text_ for name in _INFRA_ERRORS)


async def _phase(results: dict[str, Any], name: str, make: Any, engine: Any, amqp_url: str) -> Any:
    """Run one phase, bounded; if PostgreSQL or RabbitMQ went away under it, wait and run it once more."""
    print(f"bench: {name} ...", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    value = None
    for attempt in (1, 2):
        try:
            await _infra_answers(engine, amqp_url)
            value = await asyncio.wait_for(make(), timeout=PHASE_TIMEOUTS.get(name, PHASE_TIMEOUT))
            break
        except Exception as e:
            traceback.print_exc()
            stop_all()
            message = f"{e.__class__.__name__}: {e}"[:600]
            if attempt == 1 and _infra_failure(e):
                last = [ln.strip() for ln in message.splitlines() if ln.strip()][-1]
                results.setdefault("interference", []).append(
                    f"phase {name}: PostgreSQL or RabbitMQ went away under it ({last[:200]}); run again")
                continue
            results.setdefault("phase_errors", {})[name] = message
            value = None
    stop_all()  # nothing a phase started survives it
    results.setdefault("phase_seconds", {})[name] = round(time.monotonic() - t0, 1)
    results.setdefault("loadavg_after", {})[name] = round(loadavg(), 2)
    print(f"bench: {name} done in {time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)
    return value


async def _limits(infra: Infra, engine: Any, knobs: Knobs) -> dict[str, Any]:
    out: dict[str, Any] = {}
    await infra.reset(engine)
    await limits.seed_runs(infra)
    out["postgres"] = await limits.postgres(infra, clients=knobs.pg_clients, seconds=knobs.limit_seconds)
    out["rabbitmq"] = await limits.rabbitmq(infra, seconds=knobs.limit_seconds)
    out["rate_limited_call"] = await rate_limited.cost(infra, calls=knobs.limited_calls)
    # Two processes first: the one-process loop, the ensemble's reference, runs last, just before it.
    two, one = [await limits.bare_loop(infra, processes=processes, inflight=knobs.inflight,
                                       seconds=knobs.limit_seconds) for processes in (2, 1)]
    out["bare_loop"] = [one, two]
    return out


async def _bare_after(infra: Infra, engine: Any, knobs: Knobs) -> dict[str, Any]:
    """The one-process bare loop again, right after the ensemble: the ensemble is compared with the
    mean of both, so a machine that sped up or slowed down between the two does not decide the ratio."""
    await infra.reset(engine)
    await limits.seed_runs(infra)
    return await limits.bare_loop(infra, processes=1, inflight=knobs.inflight, seconds=knobs.limit_seconds)


async def _scale(infra: Infra, engine: Any, knobs: Knobs, ens: dict[str, Any] | None) -> list[dict[str, Any]]:
    points = []
    for workers in knobs.replicas:
        if ens and ens.get("workers") == workers and ens.get("saturate"):
            points.append({**ens["saturate"], "reused_from": "ensemble"})
            continue
        for attempt in (1, 2):
            try:
                await _infra_answers(engine, infra.amqp_url)
                points.append(await ensemble.scale_point(infra, engine, knobs, workers))
                break
            except Exception as e:
                stop_all()
                if attempt == 1 and _infra_failure(e):
                    continue
                points.append({"workers": workers, "error": f"{e.__class__.__name__}: {e}"[:600]})
        stop_all()
    return points


async def main_async(args: argparse.Namespace) -> int:
    knobs = Knobs.from_env()
    started = datetime.now(UTC)
    logs = ROOT / "var" / "bench" / f"logs-{started:%Y%m%dT%H%M%S}"
    infra = Infra.create(logs)
    engine = infra.engine(4)
    results: dict[str, Any] = {"started_at": started.isoformat(timespec="seconds"), "commit": _commit(),
                               "knobs": knobs.as_dict(), "logs": str(logs)}
    # The ensemble runs between two one-process bare loops: the machine's speed drifts by minutes
    # (by a quarter within one run), and its ratio to the bare loop is the tightest target.
    phases = {
        "limits": lambda: _limits(infra, engine, knobs),
        "ensemble": lambda: ensemble.run_phase(infra, engine, knobs, knobs.workers),
        "bare_after": lambda: _bare_after(infra, engine, knobs),
        "retention": lambda: pruning.default_and_short_horizon(infra, engine, knobs, knobs.workers),
        "code_first": lambda: ensemble.code_first_phase(infra, engine, knobs, knobs.workers),
        "dbos": lambda: peers.dbos(infra, knobs),
        "temporal": lambda: peers.temporal(infra, knobs),
        "restate": lambda: peers.restate(infra, knobs),
        "scale": lambda: _scale(infra, engine, knobs, results.get("ensemble")),
        "timers": lambda: timers.timers_due_at_once(infra, engine, knobs),
        "recovery": lambda: recovery.sigkill_a_worker(infra, engine, knobs),
        "waiting": lambda: timers.waiting_is_free(infra, engine, knobs),
        "million": lambda: scale.million(infra, engine, knobs),
        "timeline": lambda: timeline.phase(infra, engine, knobs),
    }
    try:
        results["machine"] = _machine(infra)
        for name, make in phases.items():  # in this order: scale reuses the ensemble's saturation
            if name in knobs.phases:
                results[name] = await _phase(results, name, make, engine, infra.amqp_url)
    finally:
        stop_all()
        try:
            await engine.dispose()
            if not args.keep_db:
                infra.teardown()
        except Exception as e:  # the report still gets written
            results.setdefault("phase_errors", {})["teardown"] = f"{e.__class__.__name__}: {e}"
    results.setdefault("machine", {})["loadavg_end"] = round(loadavg(), 2)
    results["interference"] = results.get("interference", []) + interference(logs)
    busy = results["machine"].get("cpu_busy_before_start_pct", 0.0)
    if busy >= 25:
        results["interference"].append(
            f"before the bench started, other processes kept the machine {busy:.0f}% busy (of "
            f"{100 * (os.cpu_count() or 1)}%; load average {results['machine'].get('loadavg_start')}): absolute "
            "figures are lower than on an idle machine; ratios from the same run are the comparable ones")
    results["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    results["ratios"] = report.ratios(results)
    results["targets"] = report.targets(results, results["ratios"])
    out = Path(args.json) if args.json else ROOT / "var" / "bench" / f"{started:%Y%m%dT%H%M%S}.json"
    report.write(results, out)
    print(report.table(results))
    print(f"\nJSON: {out}\nlogs: {logs}")
    return 1 if results.get("phase_errors") else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="where to write the JSON (default var/bench/<timestamp>.json)")
    parser.add_argument("--keep-db", action="store_true", help="keep the bench database and vhost afterwards")
    args = parser.parse_args()

    def on_signal(signum: int, _frame: object) -> None:
        stop_all()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        code = asyncio.run(main_async(args))
    except KeyboardInterrupt:
        stop_all()
        code = 130
    raise SystemExit(code)


if __name__ == "__main__":
    main()
