"""Statements sent by psycopg itself (longrun.db.driver) keep the engine's transactions and values."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

from longrun.db import driver
from tests.integration import runs_factory

pytestmark = pytest.mark.integration

_JSON = driver.Statement(text("SELECT jsonb_typeof(:v) AS kind, :v ->> 'k' AS k").bindparams(
    bindparam("v", type_=JSONB)))
_RENAME = driver.Statement(text("UPDATE runs SET approval_owner = :owner WHERE run_id = :run_id"))


async def _owner(engine, run_id: str) -> str | None:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT approval_owner FROM runs WHERE run_id = :r"),
                                   {"r": run_id})).scalar_one()


async def test_a_statement_on_a_sqlalchemy_connection_commits_and_rolls_back_with_its_transaction(
        clean, engine) -> None:
    # Given a run
    run_id = (await runs_factory.created(engine)).snapshot.run_id
    # When a statement is sent in a transaction that then fails, Then it is rolled back with it
    with pytest.raises(RuntimeError):
        async with engine.begin() as conn:
            await driver.execute(conn, _RENAME, {"owner": "rolled-back", "run_id": run_id})
            raise RuntimeError("the transaction fails after the statement")
    assert await _owner(engine, run_id) is None
    # When it is the first statement of a connection committed by hand (SQLAlchemy begins on first
    # use), Then that commit commits it
    async with engine.connect() as conn:
        await driver.execute(conn, _RENAME, {"owner": "committed", "run_id": run_id})
        await conn.commit()
    assert await _owner(engine, run_id) == "committed"
    # and a connection closed without a commit leaves nothing
    async with engine.connect() as conn:
        await driver.execute(conn, _RENAME, {"owner": "never committed", "run_id": run_id})
    assert await _owner(engine, run_id) == "committed"


async def test_a_pooled_statement_commits_on_its_own(clean, engine, statements) -> None:
    run_id = (await runs_factory.created(engine)).snapshot.run_id
    async with statements.connection() as conn:
        await driver.execute(conn, _RENAME, {"owner": "alone", "run_id": run_id})
    assert await _owner(engine, run_id) == "alone"


async def test_json_parameters_are_sent_as_the_engine_sends_them(engine, statements) -> None:
    # None is JSON null (as SQLAlchemy's JSONB type sends it), not SQL NULL
    async with statements.connection() as conn:
        assert tuple(await driver.one(conn, _JSON, {"v": None})) == ("null", None)
        assert tuple(await driver.one(conn, _JSON, {"v": {"k": "v"}})) == ("object", "v")
    async with engine.connect() as conn:
        same = (await conn.execute(text("SELECT jsonb_typeof(:v)").bindparams(bindparam("v", type_=JSONB)),
                                   {"v": None})).scalar_one()
    assert same == "null"


async def test_a_pooled_statement_is_prepared_on_its_first_use(statements) -> None:
    # Given a statement this pool's connection has not sent before
    probe = driver.Statement(text("SELECT :n + 1 AS m"))
    async with statements.connection() as conn:
        # When it is sent once
        assert (await driver.one(conn, probe, {"n": 41})).m == 42
        # Then the connection holds it prepared (psycopg's default prepares on the sixth use)
        prepared = await (await conn.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ("SELECT $1 + 1 AS m%",))).fetchone()
    assert prepared == (1,)


async def test_a_statement_is_sent_with_numbered_placeholders(statements) -> None:
    # Given a statement with a literal percent sign, a parameter used twice, and more parameters and
    # text than psycopg caches a named-placeholder query for (50, 4,096 bytes)
    many = ", ".join(f":p{i} AS c{i}" for i in range(60))
    probe = driver.Statement(text(f"SELECT 'a%b' AS pct, :n + :n AS twice, {many} /* {'x' * 4096} */"))
    values = {"n": 2, **{f"p{i}": i for i in range(60)}}
    async with statements.connection() as conn:
        # When it is sent, Then each value lands in its place
        row = await driver.one(conn, probe, values)
        assert (row.pct, row.twice, row.c0, row.c59) == ("a%b", 4, 0, 59)
        # and a missing parameter is named, before anything is sent
        with pytest.raises(psycopg.ProgrammingError, match="query parameter missing: p7"):
            await driver.one(conn, probe, {k: v for k, v in values.items() if k != "p7"})
