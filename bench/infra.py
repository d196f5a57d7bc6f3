"""The bench's own database and vhost, and the real service processes it runs on them.

The bench never touches other data: it creates ``longrun_bench`` (migrated with the real
migrations) and the vhost ``longrun_bench``, empties both between phases, and drops
both at the end.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.common import ROOT, Proc, free_port
from longrun.bus import topology
from longrun.config import DEFAULT_AMQP_URL, DEFAULT_DATABASE_URL
from longrun.db import migrate
from longrun.db.retention import RULES
from longrun.db.engine import make_engine
from longrun.db.schema import metadata

DB_NAME = "longrun_bench"
VHOST = "longrun_bench"
_SEQ = itertools.count(1)
SERVICE_MODULES = {"scheduler": "longrun.services.scheduler", "worker": "longrun.services.worker", "timer": "longrun.services.timer",
                   "reconciler": "longrun.services.reconciler", "relay": "longrun.services.outbox_relay"}


def ctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, check=check, timeout=120)


@dataclass
class Infra:
    admin_db_url: str
    database_url: str
    amqp_url: str
    vhost: str | None
    logs: Path

    @classmethod
    def create(cls, logs: Path) -> Infra:
        base_db = os.environ.get("LONGRUN_DATABASE_URL", DEFAULT_DATABASE_URL).replace(
            "postgresql://", "postgresql+psycopg://", 1)
        base_amqp = os.environ.get("LONGRUN_AMQP_URL", DEFAULT_AMQP_URL)
        db_url = make_url(base_db).set(database=DB_NAME).render_as_string(hide_password=False)
        host = urlsplit(base_amqp).hostname or ""
        vhost = None
        amqp_url = base_amqp
        if host in ("127.0.0.1", "localhost", "::1") and shutil.which("rabbitmqctl"):
            vhost = VHOST
            ctl("add_vhost", vhost, check=False)
            ctl("set_permissions", "-p", vhost, urlsplit(base_amqp).username or "guest", ".*", ".*", ".*")
            parts = urlsplit(base_amqp)
            amqp_url = urlunsplit((parts.scheme, parts.netloc, "/" + quote(vhost, safe=""), "", ""))
        infra = cls(base_db, db_url, amqp_url, vhost, logs)
        infra.drop_database()
        migrate.create_database(db_url)
        migrate.upgrade(db_url)
        return infra

    def engine(self, pool_size: int = 4) -> AsyncEngine:
        return make_engine(self.database_url, pool_size=pool_size)

    @property
    def libpq_url(self) -> str:
        return self.database_url.replace("postgresql+psycopg://", "postgresql://", 1)

    def drop_database(self, name: str = DB_NAME) -> None:
        admin = create_engine(make_url(self.admin_db_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    def create_side_database(self, name: str) -> str:
        """A second database on the same server (DBOS's system database); dropped at teardown."""
        self.drop_database(name)
        url = make_url(self.admin_db_url).set(database=name).render_as_string(hide_password=False)
        migrate.create_database(url)
        return url

    async def reset(self, engine: AsyncEngine) -> None:
        """Empty every table and every queue of the bench vhost (between phases)."""
        names = ", ".join(f'"{t.name}"' for t in reversed(metadata.sorted_tables))
        async with engine.begin() as conn:
            await conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
        await self.purge_queues()

    async def purge_queues(self) -> None:
        import aio_pika

        topo = topology.build(partitions=int(os.environ.get("BENCH_PARTITIONS", "8")), delivery_limit=5)
        connection = await aio_pika.connect(self.amqp_url)
        async with connection:
            channel = await connection.channel()
            for queue in topo.queues:
                if queue.arguments.get("x-queue-type") == "stream":
                    continue
                try:
                    q = await channel.get_queue(queue.name, ensure=True)
                    await q.purge()
                except Exception:
                    channel = await connection.channel()  # not declared yet: nothing to purge

    def teardown(self) -> None:
        if self.vhost:
            ctl("delete_vhost", self.vhost, check=False)
        self.drop_database()


async def pg_xacts(engine: AsyncEngine) -> tuple[int, int]:
    """(xact_commit, xact_rollback) of the bench database; flushed by backends within ~1 s, at exit at once."""
    async with engine.connect() as conn:
        row = (await conn.execute(text(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()"))).one()
    return int(row[0]), int(row[1])


# -- the service processes -----------------------------------------------------------------------

PRUNED = ("OUTBOX", "INBOX", "TIMERS", "WEBHOOK_EVENTS", "DELIVERY_FAILURES", "REPLAYED_QUARANTINE", "DEAD_MEMBERS",
          "AUDIT")


FINISHED_RUNS_KEPT = 60.0
"""Seconds a finished run keeps its events under ``BENCH_RETENTION``: each measurement reads its own
runs' events within seconds of its end, so the later ones run while the earlier runs are archived."""


def pruning_env(seconds: str) -> dict[str, str]:
    """``BENCH_RETENTION=S``: the reconciler prunes every S seconds, every table's horizon S (the replay
    window S/2, below the inbox's), finished runs archived ``FINISHED_RUNS_KEPT`` (or S, if longer)
    after they end."""
    if not seconds:
        return {}
    try:
        every = float(seconds)
    except ValueError:
        raise SystemExit(f"BENCH_RETENTION: expected seconds, got {seconds!r}") from None
    return {"LONGRUN_RETENTION_INTERVAL": f"{every:g}", "LONGRUN_QUARANTINE_REPLAY_WINDOW": f"{every / 2:g}",
            "LONGRUN_RETAIN_FINISHED_RUNS": f"{max(every, FINISHED_RUNS_KEPT):g}",
            **{f"LONGRUN_RETAIN_{t}": f"{every:g}" for t in PRUNED}}


async def pruned_so_far(engine: AsyncEngine) -> dict[str, int]:
    """Rows deleted from each table retention prunes (PostgreSQL's own statistics, which lag by up
    to a second), and finished runs archived: what a phase's difference shows retention did."""
    async with engine.connect() as conn:
        deleted = {row.relname: int(row.n_tup_del) for row in (await conn.execute(text(
            "SELECT relname, n_tup_del FROM pg_stat_user_tables WHERE relname = ANY(:tables)"),
            {"tables": sorted({rule.table for rule in RULES.values()} | {"run_events", "actions"})})).all()}
        archived = int((await conn.execute(text(
            "SELECT count(*) FROM runs WHERE archived_at IS NOT NULL"))).scalar_one())
    return {**deleted, "runs archived": archived}


class Services:
    """Real service processes on the bench database and vhost, started and stopped by PID."""

    def __init__(self, infra: Infra, *, partitions: int, lease_ttl: float, log_level: str,
                 count_dir: Path | None = None, timeline_dir: Path | None = None, **extra: str) -> None:
        """``count_dir``: each service counts its SQL (``bench.counting``); ``timeline_dir``: each marks
        a lone create's way instead (``bench.timeline``)."""
        self.infra = infra
        self.partitions = partitions
        self.count_dir = count_dir
        self.timeline_dir = timeline_dir
        self.extra = {"LONGRUN_RUN_LEASE_TTL": f"{lease_ttl:g}", "LONGRUN_LOG_LEVEL": log_level,
                      **pruning_env(os.environ.get("BENCH_RETENTION", "")), **extra}
        self.procs: dict[str, Proc] = {}
        self.ports: dict[str, int] = {}
        self.label = f"{next(_SEQ):02d}"
        """Prefix of this set's log files, so each phase's logs stay apart."""

    def env(self, name: str, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LONGRUN_")}
        env.update({
            "LONGRUN_DATABASE_URL": self.infra.database_url,
            "LONGRUN_AMQP_URL": self.infra.amqp_url,
            # where the scheduler sets the ingress bound, when not port 15672 of the broker's nodes
            "LONGRUN_RABBITMQ_MANAGEMENT_URL": os.environ.get("LONGRUN_RABBITMQ_MANAGEMENT_URL", ""),
            "LONGRUN_PARTITIONS": str(self.partitions),
            "LONGRUN_PARTITION_LEASE_TTL": "3",
            "LONGRUN_RELAY_POLL_INTERVAL": "0.5",
            "LONGRUN_INSTANCE_ID": name,
            "LONGRUN_ARTIFACT_DIR": str(self.infra.logs / "artifacts"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "shared")]),  # this checkout's code
        })
        env.update(self.extra)
        env.update(extra)
        return env

    def start(self, name: str, service: str, **extra: str) -> Proc:
        module = SERVICE_MODULES[service]
        port = free_port()
        argv = [sys.executable, "-m", module]
        env = self.env(name, LONGRUN_HEALTH_PORT=str(port), **extra)
        if self.timeline_dir is not None:
            argv = [sys.executable, "-m", "bench.timeline", module]
            env["BENCH_TIMELINE_FILE"] = str(self.timeline_dir / f"{name}.marks")
        elif self.count_dir is not None:
            argv = [sys.executable, "-m", "bench.counting", module]
            env["BENCH_COUNT_FILE"] = str(self.count_dir / f"{name}.json")
        proc = Proc(name, argv, env=env, log=self.infra.logs / f"{self.label}-{name}.log")
        self.procs[name] = proc
        self.ports[name] = port
        return proc

    async def ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=1) as http:
            for name, proc in self.procs.items():
                while True:
                    if not proc.alive():
                        raise RuntimeError(f"{name} exited with {proc.popen.returncode}: {proc.tail()}")
                    try:
                        if (await http.get(f"http://127.0.0.1:{self.ports[name]}/readyz")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{name} not ready after {timeout:.0f}s: {proc.tail()}")
                    await asyncio.sleep(0.1)

    async def partitions_owned(self, engine: AsyncEngine, service: str = "worker", timeout: float = 30) -> None:
        """Wait until every partition of ``service`` has a live owner (replicas settled)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            async with engine.connect() as conn:
                owned = (await conn.execute(text(
                    "SELECT count(*) FROM partition_leases WHERE service = :s AND owner IS NOT NULL "
                    "AND lease_until > now()"), {"s": service})).scalar_one()
            if owned >= self.partitions:
                return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{service} partitions not all owned after {timeout:.0f}s")

    def pids(self, prefix: str = "") -> list[int]:
        return [p.pid for n, p in self.procs.items() if n.startswith(prefix) and p.alive()]

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate(timeout=15)

    async def snapshot_counts(self) -> dict[str, dict[str, int]]:
        """Ask every (counting) service for its SQL counts now (SIGUSR1) and read them."""
        if self.count_dir is None:
            return {}
        for proc in self.procs.values():
            if proc.alive():
                os.kill(proc.pid, signal.SIGUSR1)
        await asyncio.sleep(0.3)
        return self.counts()

    def counts(self) -> dict[str, Any]:
        """Per-service SQL statement and transaction counts written by ``bench.counting`` at exit."""
        out: dict[str, Any] = {}
        if self.count_dir is None:
            return out
        for name in self.procs:
            path = self.count_dir / f"{name}.json"
            if path.exists():
                out[name] = json.loads(path.read_text())
        return out

    def errors(self) -> dict[str, str]:
        """Tracebacks / ERROR lines in the service logs (reported, never hidden)."""
        found = {}
        for name, proc in self.procs.items():
            tail = proc.tail(200_000)
            lines = [ln for ln in tail.splitlines() if " ERROR " in ln or "Traceback" in ln]
            lost = sum(1 for ln in tail.splitlines() if "lease" in ln and " lost" in ln)
            if lost:
                found[f"{name} leases lost"] = str(lost)
            if lines:
                found[name] = f"{len(lines)} error line(s), first: {lines[0][:300]}"
        return found


def interference(logs: Path) -> list[str]:
    """What disturbed the measurements from outside the bench, as far as the service logs tell."""
    forced = 0
    for path in logs.glob("*.log"):
        forced += path.read_text(errors="replace").count("CONNECTION_FORCED")
    notes = []
    if forced:
        notes.append(f"RabbitMQ force-closed the services' connections {forced} time(s) (CONNECTION_FORCED: "
                     "someone outside the bench closed connections on the shared broker); affected phases "
                     "include reconnect time")
    return notes
