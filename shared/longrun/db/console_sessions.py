"""Web console sessions (``schema.console_sessions``): opened at sign-in under the SHA-256 of the
session's random id, found while neither ended nor expired (with whether the named token that
signed it in is still live), ended at sign-out; the expired ones are purged a bounded batch at a
time, at sign-in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db.schema_tenants import console_sessions, operator_tokens
from longrun.db.tokens import LIVE, digest
from longrun.principals import Principal

PURGED_AT_ONCE = 100
"""Expired sessions one sign-in deletes at most: each sign-in adds one, so the table stays near the
sessions still live, and no sign-in waits on a long delete."""


@dataclass(frozen=True, slots=True)
class Kept:
    """A live session: who signed in, and what is asked again of the credential that signed them in."""

    principal: Principal
    token_id: int | None
    token_live: bool
    """A named token's session: its token is neither revoked nor expired now."""
    bootstrap_sha256: str | None


def _principal_json(principal: Principal) -> dict[str, Any]:
    return {"subject": principal.subject, "roles": sorted(principal.roles),
            "tenants": None if principal.tenants is None else sorted(principal.tenants),
            "groups": sorted(principal.groups), "credential": principal.credential}


def _principal(value: dict[str, Any]) -> Principal:
    return Principal(value["subject"], frozenset(value["roles"]),
                     None if value["tenants"] is None else frozenset(value["tenants"]),
                     frozenset(value["groups"]), value["credential"])


async def open_session(conn: AsyncConnection, session_id: str, principal: Principal, *, token_id: int | None,
                       bootstrap_sha256: str | None, lifetime: float) -> None:
    """Keep a signed-in session for ``lifetime`` seconds of the database's clock; expired sessions
    are purged first (at most ``PURGED_AT_ONCE``)."""
    await purge_expired(conn, PURGED_AT_ONCE)
    await conn.execute(console_sessions.insert().values(
        id_sha256=digest(session_id), principal=_principal_json(principal), token_id=token_id,
        bootstrap_sha256=bootstrap_sha256,
        expires_at=func.now() + func.make_interval(0, 0, 0, 0, 0, 0, lifetime)))


async def find(conn: AsyncConnection, session_id: str) -> Kept | None:
    """The session of this id if it is neither ended nor expired; None for any other id."""
    token_live = select(operator_tokens.c.id).where(operator_tokens.c.id == console_sessions.c.token_id,
                                                    *LIVE).exists()
    row = (await conn.execute(select(console_sessions.c.principal, console_sessions.c.token_id,
                                     console_sessions.c.bootstrap_sha256, token_live.label("token_live"))
                              .where(console_sessions.c.id_sha256 == digest(session_id),
                                     console_sessions.c.ended_at.is_(None),
                                     console_sessions.c.expires_at > func.now()))).first()
    if row is None:
        return None
    return Kept(_principal(row.principal), row.token_id, bool(row.token_live), row.bootstrap_sha256)


async def end(conn: AsyncConnection, session_id: str) -> None:
    """End the session (once: an ended session keeps its first end), so no copy of its cookie is taken again."""
    await conn.execute(update(console_sessions).where(console_sessions.c.id_sha256 == digest(session_id),
                                                      console_sessions.c.ended_at.is_(None))
                       .values(ended_at=func.now()))


async def purge_expired(conn: AsyncConnection, limit: int) -> int:
    """Delete at most ``limit`` sessions past their expiry (ended or not; locked ones are left for
    the next purge); how many went."""
    expired = (select(console_sessions.c.id_sha256).where(console_sessions.c.expires_at <= func.now())
               .limit(limit).with_for_update(skip_locked=True))
    result = await conn.execute(delete(console_sessions).where(
        console_sessions.c.id_sha256.in_(expired.scalar_subquery())))
    return int(result.rowcount)
