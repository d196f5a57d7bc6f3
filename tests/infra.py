"""Locate PostgreSQL and RabbitMQ for tests and give each session its own database and vhost."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from urllib.parse import quote, urlsplit, urlunsplit

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


@dataclass(frozen=True)
class Infra:
    database_url: str
    amqp_url: str
    rabbitmqctl: bool
    """True when the broker is local and rabbitmqctl can restart it and add vhosts."""

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
    import os

    db_url = os.environ.get("LONGRUN_DATABASE_URL", DEFAULT_DATABASE_URL)
    amqp_url = os.environ.get("LONGRUN_AMQP_URL", DEFAULT_AMQP_URL)
    if _answers(db_url, 5432) and _answers(amqp_url, 5672):
        host = urlsplit(amqp_url).hostname or ""
        local = host in ("127.0.0.1", "localhost", "::1") and shutil.which("rabbitmqctl") is not None
        return Infra(db_url.replace("postgresql://", "postgresql+psycopg://", 1), amqp_url, local)
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
    mq = RabbitMqContainer("rabbitmq:3.10-management").start()
    amqp = f"amqp://guest:guest@{mq.get_container_host_ip()}:{mq.get_exposed_port(5672)}/"
    return Infra(pg.get_connection_url(), amqp, rabbitmqctl=False)
