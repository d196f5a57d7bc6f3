"""Async engine for PostgreSQL (SQLAlchemy 2 + psycopg 3) and a reachability check.

The statements on every step's way are sent by psycopg itself (``longrun.db.driver``); the
engine carries the rest. Database time (``now()``) is the clock for leases and timers, so
replicas with skewed clocks still agree.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from psycopg.conninfo import make_conninfo
from sqlalchemy import text
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from longrun.errors import InfrastructureUnreachable

START_HINT = (
    "start PostgreSQL (on Debian: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start) "
    "or point LONGRUN_DATABASE_URL at a running server"
)
_DIALECT = PGDialect_psycopg()


def make_engine(url: str, *, pool_size: int = 10, idle_transaction_timeout: float | None = None) -> AsyncEngine:
    """``idle_transaction_timeout``: seconds the server lets a session idle inside a transaction (a
    process frozen mid-transaction would otherwise hold its row locks until it is killed)."""
    options = {} if idle_transaction_timeout is None else {
        "options": f"-c idle_in_transaction_session_timeout={max(1, round(idle_transaction_timeout * 1000))}"}
    # JSONB values keep the standard library's encoder: it writes NaN, which PostgreSQL refuses
    # with a clear error, where orjson (db/jsonb.py) would silently write null into a run's goal.
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size,
                               pool_recycle=300, connect_args=options)


@asynccontextmanager
async def autocommit(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection for statements each atomic on its own: no BEGIN and COMMIT round trips around them."""
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn


def psycopg_dsn(url: str) -> str:
    """The libpq form of a SQLAlchemy URL, for psycopg's own connections (the statement pool, LISTEN).

    Read as SQLAlchemy reads it, so a replicated database's address survives: several hosts
    (``?host=a:5432&host=b:5432``) become libpq's host and port lists, and options such as
    ``target_session_attrs=read-write`` pass through, letting every connection find the promoted
    standby after a failover with no change of configuration."""
    _, params = _DIALECT.create_connect_args(make_url(url))
    return make_conninfo("", **params)


async def check_reachable(engine: AsyncEngine) -> None:
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception as e:
        raise InfrastructureUnreachable(
            f"PostgreSQL is not reachable at {engine.url.render_as_string(hide_password=True)}: "
            f"{e.__class__.__name__}: {e}. To fix: {START_HINT}"
        ) from e
