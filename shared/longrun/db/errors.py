"""The one seam where driver errors are classified."""

from __future__ import annotations

import psycopg
from sqlalchemy import exc as sa_exc


def is_transient(error: BaseException) -> bool:
    """Connection-level failures: the database may be back in a moment, nothing was decided."""
    if isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError)):
        return True
    if isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError, ConnectionError, OSError)):
        return True
    orig = getattr(error, "orig", None)
    return isinstance(orig, (psycopg.OperationalError, psycopg.InterfaceError))


def is_unique_violation(error: BaseException) -> bool:
    """A row with that key exists: the statement changed nothing (raised by SQLAlchemy or, for the
    statements ``longrun.db.driver`` sends, by psycopg)."""
    return isinstance(getattr(error, "orig", error), psycopg.errors.UniqueViolation)
