"""Named API tokens (``schema.operator_tokens``): created with a random secret shown once, found by
the SHA-256 of the secret a request presents, revoked by id."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db.schema_tenants import operator_tokens

SECRET_PREFIX = "lrt_"
"""Marks a named token's secret, so one pasted where it does not belong is recognisable."""


@dataclass(frozen=True, slots=True)
class StoredToken:
    id: int
    name: str
    roles: tuple[str, ...]
    tenants: tuple[str, ...] | None
    created_by: str
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None
    expires_at: datetime | None
    permissions: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "roles": list(self.roles),
                "tenants": None if self.tenants is None else list(self.tenants), "created_by": self.created_by,
                "created_at": self.created_at.isoformat(),
                "revoked_at": None if self.revoked_at is None else self.revoked_at.isoformat(),
                "last_used_at": None if self.last_used_at is None else self.last_used_at.isoformat(),
                "expires_at": None if self.expires_at is None else self.expires_at.isoformat(),
                "permissions": list(self.permissions)}


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _stored(row: Any) -> StoredToken:
    return StoredToken(row.id, row.name, tuple(row.roles), None if row.tenants is None else tuple(row.tenants),
                       row.created_by, row.created_at, row.revoked_at, row.last_used_at, row.expires_at,
                       tuple(row.permissions))


class NameInUse(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"a live token is named {name!r} already: a name belongs to one holder (revoke that "
                         "token first to give the name to another)")


async def create(conn: AsyncConnection, *, name: str, roles: tuple[str, ...], tenants: tuple[str, ...] | None,
                 created_by: str, expires_in: float | None = None,
                 permissions: tuple[str, ...] = ()) -> tuple[StoredToken, str]:
    """A new token (its ``roles`` and, beside them, its ``permissions``) and its secret, which is not
    kept: whoever asked must take it now; refused
    ``expires_in`` seconds from now (None: until revoked). ``NameInUse`` when a live token holds the
    name (whoever asks, an admin included)."""
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    row = (await conn.execute(insert(operator_tokens).values(
        name=name, secret_sha256=digest(secret), roles=list(roles), permissions=list(permissions),
        tenants=None if tenants is None else list(tenants), created_by=created_by,
        expires_at=None if expires_in is None else func.now() + func.make_interval(0, 0, 0, 0, 0, 0, expires_in))
        .on_conflict_do_nothing(index_elements=[operator_tokens.c.name], index_where=text("revoked_at IS NULL"))
        .returning(*operator_tokens.c))).first()
    if row is None:
        raise NameInUse(name)
    return _stored(row), secret


LIVE = (operator_tokens.c.revoked_at.is_(None),
         or_(operator_tokens.c.expires_at.is_(None), operator_tokens.c.expires_at > func.now()))
"""A token is live while neither revoked nor expired."""
USE_RECORDED_EVERY = 60
"""Seconds: a token's ``last_used_at`` is written at most this often, not on every request."""


async def find(conn: AsyncConnection, secret: str) -> StoredToken | None:
    """The live (neither revoked nor expired) token whose secret this is, its use recorded; None for any other."""
    row = (await conn.execute(select(operator_tokens).where(
        operator_tokens.c.secret_sha256 == digest(secret), *LIVE))).first()
    if row is None:
        return None
    stale = func.now() - func.make_interval(0, 0, 0, 0, 0, 0, USE_RECORDED_EVERY)
    await conn.execute(update(operator_tokens).where(
        operator_tokens.c.id == row.id, or_(operator_tokens.c.last_used_at.is_(None),
                                            operator_tokens.c.last_used_at < stale))
        .values(last_used_at=func.now()))
    return _stored(row)


async def listing(conn: AsyncConnection, *, include_revoked: bool) -> list[StoredToken]:
    query = select(operator_tokens).order_by(operator_tokens.c.id)
    if not include_revoked:
        query = query.where(operator_tokens.c.revoked_at.is_(None))
    return [_stored(row) for row in (await conn.execute(query)).all()]


async def revoke(conn: AsyncConnection, token_id: int) -> StoredToken | None:
    """Revoke the token (once: a revoked token keeps its first revocation time); None: there is none."""
    await conn.execute(update(operator_tokens).where(operator_tokens.c.id == token_id,
                                                     operator_tokens.c.revoked_at.is_(None))
                       .values(revoked_at=func.now()))
    row = (await conn.execute(select(operator_tokens).where(operator_tokens.c.id == token_id))).first()
    return None if row is None else _stored(row)


async def any_live(conn: AsyncConnection) -> bool:
    """Whether some token is neither revoked nor expired."""
    found = (await conn.execute(select(operator_tokens.c.id).where(*LIVE).limit(1))).first()
    return found is not None
