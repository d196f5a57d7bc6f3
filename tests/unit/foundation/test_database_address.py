"""psycopg's own connections (statement pool, LISTEN) read the database URL as SQLAlchemy does."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from longrun.db.engine import psycopg_dsn


def test_a_replicated_databases_hosts_and_session_attributes_reach_libpq() -> None:
    dsn = psycopg_dsn("postgresql+psycopg://longrun:p%40ss@/longrun?host=pg-a:5432&host=pg-b:5433"
                      "&target_session_attrs=read-write&connect_timeout=2")
    assert conninfo_to_dict(dsn) == {"host": "pg-a,pg-b", "port": "5432,5433", "dbname": "longrun",
                                     "user": "longrun", "password": "p@ss", "target_session_attrs": "read-write",
                                     "connect_timeout": "2"}


def test_a_single_host_url_keeps_its_host_port_and_options() -> None:
    dsn = psycopg_dsn("postgresql+psycopg://postgres@127.0.0.1:5432/longrun?options=-c%20statement_timeout%3D5")
    assert conninfo_to_dict(dsn) == {"host": "127.0.0.1", "port": "5432", "dbname": "longrun", "user": "postgres",
                                     "options": "-c statement_timeout=5"}
