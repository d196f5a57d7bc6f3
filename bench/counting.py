"""Run a service module unchanged, counting its SQL round trips: ``python -m bench.counting longrun.services.worker``.

Class-level SQLAlchemy listeners count every statement execution (an ``executemany`` is
one, as psycopg pipelines it), every BEGIN, COMMIT and ROLLBACK of every engine in the
process, and apart from them the uses of AUTOCOMMIT connections (which send none of the three);
a wrapper around ``longrun.db.driver.execute`` counts the statements psycopg sends itself, those
on its pool's autocommit connections apart. On SIGUSR1 and at exit (the service stops on SIGTERM) the counts go to
``$BENCH_COUNT_FILE``, so the bench can take the difference over a measured window.
The cost is one Python call per statement; the service code is the real one.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import sys
from collections import Counter

import psycopg
from sqlalchemy import event
from sqlalchemy.engine import Engine

from longrun.db import driver

COUNTS: Counter[str] = Counter()


def _install() -> None:
    @event.listens_for(Engine, "before_cursor_execute")
    def _statement(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        COUNTS["statements"] += 1
        if conn.info.get("bench_autocommit"):
            COUNTS["autocommit_statements"] += 1
        if executemany:
            COUNTS["executemany"] += 1

    # On an AUTOCOMMIT connection SQLAlchemy still begins and ends a transaction of its own, but
    # psycopg sends neither BEGIN nor COMMIT/ROLLBACK: each statement is its own transaction.
    @event.listens_for(Engine, "begin")
    def _begin(conn):  # type: ignore[no-untyped-def]
        autocommit = conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
        conn.info["bench_autocommit"] = autocommit
        COUNTS["autocommit_uses" if autocommit else "begin"] += 1

    @event.listens_for(Engine, "commit")
    def _commit(conn):  # type: ignore[no-untyped-def]
        if not conn.info.pop("bench_autocommit", False):
            COUNTS["commit"] += 1

    @event.listens_for(Engine, "rollback")
    def _rollback(conn):  # type: ignore[no-untyped-def]
        if not conn.info.pop("bench_autocommit", False):
            COUNTS["rollback"] += 1

    execute = driver.execute

    async def counted(conn, statement, params={}):  # type: ignore[no-untyped-def]  # noqa: B006
        COUNTS["statements"] += 1
        if isinstance(conn, psycopg.AsyncConnection):
            COUNTS["autocommit_statements"] += 1
        return await execute(conn, statement, params)

    driver.execute = counted


def _dump(*_: object) -> None:
    path = os.environ.get("BENCH_COUNT_FILE")
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(dict(COUNTS), f)
        os.replace(path + ".tmp", path)


def main() -> None:
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    _install()
    atexit.register(_dump)
    signal.signal(signal.SIGUSR1, _dump)
    profile_to = os.environ.get("BENCH_PROFILE_FILE")
    if profile_to:  # investigation only: where a service spends its CPU (python -m pstats FILE)
        import cProfile

        import time

        profiler = cProfile.Profile(time.process_time)
        atexit.register(lambda: profiler.dump_stats(profile_to))
        profiler.enable()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
