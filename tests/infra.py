"""Locate PostgreSQL and RabbitMQ for tests and give each session its own database and vhost."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from longrun.config import DEFAULT_AMQP_URL, DEFAULT_DATABASE_URL
from longrun.db import migrate

START_HELP = """PostgreSQL and RabbitMQ are needed and none was reachable.
Start the local services:
  pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start
  rabbitmq-server -detached
or point LONGRUN_DATABASE_URL / LONGRUN_AMQP_URL at running servers,
or run a Docker engine so testcontainers can start them."""


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Infra:
    database_url: str
    amqp_url: str
    rabbitmqctl: bool
    """True when the broker is local and rabbitmqctl can restart it and add vhosts."""
    pg_ctlcluster: bool = False
    """True when the database is the local Debian cluster that pg_ctlcluster can restart."""
    management_url: str = ""
    """RabbitMQ's management API (``LONGRUN_RABBITMQ_MANAGEMENT_URL``) when not where the services
    find it from ``amqp_url`` (port 15672 of its nodes)."""

    @property
    def vhost(self) -> str:
        """The RabbitMQ virtual host of this session ("/" when the broker is not ours to scope)."""
        return unquote(urlsplit(self.amqp_url).path[1:]) or "/"

    @property
    def database(self) -> str:
        return make_url(self.database_url).database or ""

    @contextlib.contextmanager
    def session(self, name: str) -> Iterator[Infra]:
        db_url = make_url(self.database_url).set(database=name).render_as_string(hide_password=False)
        migrate.create_database(db_url)
        migrate.upgrade(db_url)
        amqp_url = self.amqp_url
        if self.rabbitmqctl:
            ctl("add_vhost", name)
            ctl("set_permissions", "-p", name, _amqp_user(self.amqp_url), ".*", ".*", ".*")
            parts = urlsplit(self.amqp_url)
            amqp_url = urlunsplit((parts.scheme, parts.netloc, "/" + quote(name, safe=""), "", ""))
        try:
            yield replace(self, database_url=db_url, amqp_url=amqp_url)
        finally:
            if self.rabbitmqctl:
                ctl("delete_vhost", name, check=False)
            admin = create_engine(make_url(self.database_url).set(database="postgres"),
                                  isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


def ctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, check=check, timeout=120)


# -- breaking the infrastructure on purpose (fault tests) ---------------------------------------------
# Each helper that stops something shared puts it back in a ``finally``, whatever happened meanwhile.


def stop_broker() -> None:
    ctl("stop_app")


def start_broker() -> None:
    ctl("start_app", check=False)
    ctl("await_startup")


@contextlib.asynccontextmanager
async def broker_stopped() -> AsyncIterator[None]:
    """RabbitMQ's application stopped (every vhost: keep the body short), then started again, always."""
    try:
        await asyncio.to_thread(stop_broker)
        yield
    finally:
        await asyncio.to_thread(start_broker)


def close_all_connections(vhost: str, reason: str = "fault test: every connection dropped") -> int:
    """Drop every AMQP connection of ``vhost`` (never another vhost's); returns how many were closed."""
    done = ctl("close_all_connections", "--vhost", vhost, reason)
    closed = [line for line in done.stdout.splitlines() if line.startswith("Closed ")]
    return int(closed[0].split()[1]) if closed else 0


def close_connections_named(vhost: str, name: str, reason: str = "fault test: connection dropped") -> int:
    """Drop the AMQP connections of ``vhost`` whose client named itself ``name`` (e.g. "worker/worker-0")."""
    listing = ctl("list_connections", "-q", "-p", vhost, "pid", "client_properties").stdout
    pids = [line.split("\t", 1)[0] for line in listing.splitlines()
            if f'{{"connection_name","{name}"}}' in line]
    for pid in pids:
        ctl("close_connection", pid, reason, check=False)
    return len(pids)


def terminate_backends(infra: Infra) -> int:
    """``pg_terminate_backend`` every connection to this session's database (no other database)."""
    admin = create_engine(make_url(infra.database_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            return len(conn.execute(text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = :db AND pid <> pg_backend_pid()"), {"db": infra.database}).all())
    finally:
        admin.dispose()


def _pg_ctlcluster(action: str, *options: str) -> subprocess.CompletedProcess[str]:
    version = sorted(os.listdir("/etc/postgresql"))[0]
    return subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action, *options],
                          capture_output=True, text=True, timeout=60)


def stop_database() -> None:
    """Like a crash: ``immediate`` drops every connection at once and skips the shutdown checkpoint
    (a ``fast`` stop can wait a minute on a busy machine); the start replays the WAL."""
    _pg_ctlcluster("stop", "-m", "immediate").check_returncode()


def start_database(timeout: float = 120) -> None:
    """Start the cluster and wait until it answers a query, however the stop went (it may still be
    shutting down): start again until it is up. Never returns with the cluster down."""
    deadline = time.monotonic() + timeout
    while not _database_answers():
        if _pg_ctlcluster("status").returncode != 0:
            started = _pg_ctlcluster("start")
            if started.returncode != 0:
                logger.warning("starting PostgreSQL: %s %s", started.stdout.strip(), started.stderr.strip())
        if time.monotonic() > deadline:
            raise RuntimeError("PostgreSQL did not come back; start it: pg_ctlcluster --skip-systemctl-redirect "
                               "$(ls /etc/postgresql) main start")
        time.sleep(0.5)


def _database_answers() -> bool:
    import psycopg

    try:
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


@contextlib.asynccontextmanager
async def database_stopped() -> AsyncIterator[None]:
    """The whole local PostgreSQL cluster stopped (everyone's databases: keep the body short),
    then started again, always. The body runs while the database is down."""
    try:
        await asyncio.to_thread(stop_database)
        yield
    finally:
        await asyncio.to_thread(start_database)


def _amqp_user(url: str) -> str:
    return urlsplit(url).username or "guest"


def _answers(url: str, default_port: int) -> bool:
    parts = urlsplit(url.replace("postgresql+psycopg", "postgresql"))
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), timeout=2):
            return True
    except OSError:
        return False


def find_infra() -> Infra | str:
    """The infrastructure to use, or the message saying what to start."""
    db_url = os.environ.get("LONGRUN_DATABASE_URL", DEFAULT_DATABASE_URL)
    amqp_url = os.environ.get("LONGRUN_AMQP_URL", DEFAULT_AMQP_URL)
    if _answers(db_url, 5432) and _answers(amqp_url, 5672):
        host = urlsplit(amqp_url).hostname or ""
        local = host in ("127.0.0.1", "localhost", "::1") and shutil.which("rabbitmqctl") is not None
        db_host = urlsplit(db_url.replace("postgresql+psycopg", "postgresql")).hostname or ""
        pg_local = (db_host in ("127.0.0.1", "localhost", "::1") and shutil.which("pg_ctlcluster") is not None
                    and os.path.isdir("/etc/postgresql"))
        return Infra(db_url.replace("postgresql://", "postgresql+psycopg://", 1), amqp_url, local, pg_local)
    return _containers() or START_HELP


def _containers() -> Infra | None:
    """testcontainers on a laptop with Docker; our CI machines have no engine."""
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
    except Exception:
        return None
    from testcontainers.postgres import PostgresContainer  # type: ignore[import-untyped]
    from testcontainers.rabbitmq import RabbitMqContainer  # type: ignore[import-untyped]

    pg = PostgresContainer("postgres:15", driver="psycopg").start()
    mq = RabbitMqContainer("rabbitmq:3.10-management").with_exposed_ports(15672).start()
    amqp = f"amqp://guest:guest@{mq.get_container_host_ip()}:{mq.get_exposed_port(5672)}/"
    api = f"http://guest:guest@{mq.get_container_host_ip()}:{mq.get_exposed_port(15672)}/"
    return Infra(pg.get_connection_url(), amqp, rabbitmqctl=False, management_url=api)
