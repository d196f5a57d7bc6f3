"""Keyset pages for the operator API's lists: newest first, a page at a time, by an opaque cursor.

A cursor is the sort key of the last row a page showed, ``(created_at, id)``, both never changing,
so a row appears on exactly one page however the rows around it change meanwhile; rows created
after the first page are not shown on later ones (a new search shows them).
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Row, Select, func, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.config.parse import duration

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_AGE = timedelta(days=36500)
"""The longest age a filter may name: a century, well inside what a timestamp can go back."""
_BIGINT = range(-(2**63), 2**63)


def limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise ValueError(f"limit must be an integer from 1 to {MAX_LIMIT}, got {raw!r}")
    return int(raw)


def older_than(name: str, raw: str, column: Any) -> ColumnElement[bool]:
    """``column`` more than the duration ``raw`` (``90s``, ``15m``, ``12h``, ``30d``) before the database's now."""
    try:
        age = timedelta(seconds=duration(raw))
    except (ValueError, OverflowError):
        age = None
    if age is None or age > MAX_AGE:
        raise ValueError(f"{name} must be a duration (seconds, or a number with s, m, h or d) of at most "
                         f"{MAX_AGE.days} days, got {raw!r}")
    return column < func.now() - age


def cursor(created_at: datetime, row_id: str | int) -> str:
    return base64.urlsafe_b64encode(json.dumps([created_at.isoformat(), row_id]).encode()).decode().rstrip("=")


def after(raw: str, created: Any, row_id: Any) -> ColumnElement[bool]:
    """Rows past the cursor ``raw`` in newest-first order."""
    try:
        at, last = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        moment = datetime.fromisoformat(at)
        if type(last) is not row_id.type.python_type or (last not in _BIGINT if isinstance(last, int)
                                                          else "\x00" in last):
            raise TypeError(f"{last!r} is no row id")
    except (binascii.Error, ValueError, TypeError) as e:
        raise ValueError(f"cursor is not one this API gave out: {raw[:40]!r}") from e
    return tuple_(created, row_id) < tuple_(moment, last)


async def newest_first(conn: AsyncConnection, query: Select[Any], *, cursor_raw: str | None, page_size: int | None,
                       created: Any, row_id: Any) -> tuple[list[Row[Any]], str | None]:
    """One page of ``query``'s rows, newest first by ``(created, row_id)`` from the cursor on, and
    the cursor of the next page (None on the last)."""
    if cursor_raw:
        query = query.where(after(cursor_raw, created, row_id))
    size = page_size or DEFAULT_LIMIT
    rows = (await conn.execute(query.order_by(created.desc(), row_id.desc()).limit(size + 1))).all()
    page = rows[:size]
    last = page[-1] if len(rows) > size else None
    return page, None if last is None else cursor(last._mapping[created.key], last._mapping[row_id.key])
