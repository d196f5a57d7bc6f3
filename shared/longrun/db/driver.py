"""The hot statements, sent by psycopg itself.

SQLAlchemy's connection checkout and execution layers cost a statement some 200 µs of CPU
more than psycopg on one of its own connections (docs/cost-model.md, fixes 21 and 22): more
than most of these statements cost PostgreSQL. The statements on every step's way (the create,
the inbox's claims and outcomes, the worker's take, step and read of a run, the relay's read and
mark) are compiled once by SQLAlchemy and sent on psycopg's connection: from a pool of
autocommit connections when the statement is atomic on its own, or on the driver connection of
the SQLAlchemy transaction it is part of.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from sqlalchemy.dialects.postgresql import psycopg as sa_psycopg
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.sqltypes import JSON

from longrun.db.engine import psycopg_dsn

Connection = AsyncConnection | psycopg.AsyncConnection[Any]
"""A SQLAlchemy connection (its transaction is joined) or one of ``Pool``'s."""

_DIALECT = sa_psycopg.dialect(paramstyle="numeric_dollar")
"""psycopg's dialect writing PostgreSQL's own ``$n`` placeholders, for a raw cursor."""


class Statement:
    """A SQLAlchemy statement compiled once for psycopg: the SQL text with PostgreSQL's own ``$n``
    placeholders, the parameter names in their order, the values of its literal binds, and which
    parameters are JSON (sent as ``jsonb``, JSON ``null`` for None, as the engine sends them).

    It runs on a raw cursor, which sends the text as it is: psycopg parses a named-placeholder query
    on every execution once it is over 4,096 bytes or 50 parameters (its cache's limits), as a
    finishing step's statement is, at some 0.4 ms of CPU each time."""

    __slots__ = ("sql", "_names", "_fixed")

    def __init__(self, clause: ClauseElement) -> None:
        compiled = clause.compile(dialect=_DIALECT)
        self.sql = str(compiled).encode()
        json = {name for bind, name in compiled.bind_names.items() if isinstance(bind.type, JSON)}
        self._names = tuple((name, name in json) for name in compiled.positiontup or ())
        self._fixed = {name: bind.effective_value for bind, name in compiled.bind_names.items() if not bind.required}

    def params(self, values: Mapping[str, Any]) -> list[Any]:
        """The values of the statement's parameters, in their order."""
        ordered = []
        for name, json in self._names:
            if name in values:
                ordered.append(Jsonb(values[name]) if json else values[name])
            elif name in self._fixed:
                ordered.append(self._fixed[name])
            else:
                raise psycopg.ProgrammingError(f"query parameter missing: {name}")
        return ordered


async def execute(conn: Connection, statement: Statement,
                  params: Mapping[str, Any] = {}) -> psycopg.AsyncCursor[Any]:  # noqa: B006
    """Run ``statement``; rows are named tuples (``row.column``, as SQLAlchemy's rows)."""
    if isinstance(conn, psycopg.AsyncConnection):
        driver = conn
    else:
        if not conn.in_transaction():
            await conn.begin()  # as SQLAlchemy's own execute would: its commit() then commits this statement
        driver = (await conn.get_raw_connection()).driver_connection
    cursor = psycopg.AsyncRawCursor(driver, row_factory=namedtuple_row)
    return await cursor.execute(statement.sql, statement.params(params))


async def first(conn: Connection, statement: Statement, params: Mapping[str, Any] = {}) -> Any:  # noqa: B006
    """The first row, or None."""
    return await (await execute(conn, statement, params)).fetchone()


async def one(conn: Connection, statement: Statement, params: Mapping[str, Any] = {}) -> Any:  # noqa: B006
    """The row of a statement that always returns exactly one."""
    row = await first(conn, statement, params)
    assert row is not None, statement.sql
    return row


async def rows(conn: Connection, statement: Statement, params: Mapping[str, Any] = {}) -> list[Any]:  # noqa: B006
    return await (await execute(conn, statement, params)).fetchall()


class Pool:
    """psycopg's pool of autocommit connections, for statements each atomic on its own.

    Its statements are prepared on first use: psycopg's default sends a statement unprepared five
    times first, and each time PostgreSQL parses and plans it again (~0.5 ms more than a prepared
    execution for a step's statement, docs/cost-model.md, fix 28), on every connection the pool opens.
    """

    def __init__(self, url: str, *, size: int = 10, timeout: float = 5.0) -> None:
        """``timeout``: seconds a statement waits for a connection (PostgreSQL down, or all busy)
        before it fails as transient."""
        self._pool = AsyncConnectionPool(psycopg_dsn(url), min_size=1, max_size=size, timeout=timeout,
                                         kwargs={"autocommit": True, "prepare_threshold": 0}, open=False,
                                         name="longrun-statements")

    async def open(self) -> None:
        await self._pool.open(wait=False)

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with self._pool.connection() as conn:
            yield conn
