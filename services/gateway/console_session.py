"""The web console's session cookie and CSRF tokens: pure functions of a key, a session and a clock.

A session is a random id and when its cookie ends, sealed into the cookie with an HMAC under
``LONGRUN_CONSOLE_SECRET``: a cookie that was altered, or sealed under another key, or is past its
end, opens to nothing. The cookie holds no bearer token and no name: who a session signed in as is
kept in PostgreSQL under the SHA-256 of its id (``longrun.db.console_sessions``), and what signed it
in is asked again on every request, so sign-out, or a revoked token, ends it for every copy of the
cookie. An id with no live session there is a visitor not signed in. The cookie is HttpOnly (no
page script reads it) and SameSite=Lax.

CSRF: every form carries ``csrf_token(key, session)``, an HMAC of the session's id, and every POST
is refused unless it carries the one of the session its cookie holds. Signing in issues a new id,
so a token seen before sign-in is worthless after.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any

COOKIE = "longrun_console"
SECURE_COOKIE = "__Host-longrun_console"
"""Over HTTPS: the browser keeps it only if it is Secure, for the whole host and no other (no Domain,
Path=/), so neither plain HTTP nor a sibling subdomain can set or read the session."""


LIFETIME = 8 * 3600
"""Seconds a session lasts from sign-in (a working day); then the operator pastes the token again."""
ID_BYTES = 32


def cookie_name(https: bool) -> str:
    return SECURE_COOKIE if https else COOKIE


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    expires: int


def new(now: float) -> Session:
    """A session of a fresh random id: not signed in until one is kept under it."""
    return Session(secrets.token_urlsafe(ID_BYTES), int(now) + LIFETIME)


def seal(key: str, session: Session) -> str:
    return seal_values(key, "session", [session.id, session.expires])


def unseal(key: str, raw: str | None, now: float) -> Session | None:
    """The session the cookie ``raw`` holds, or None if it is missing, altered or over."""
    values = unseal_values(key, "session", raw)
    if values is None or len(values) != 2 or not isinstance(values[0], str) or not isinstance(values[1], int):
        return None
    session = Session(*values)
    return session if session.expires > now else None


def seal_values(key: str, purpose: str, values: list[Any]) -> str:
    """JSON ``values`` with an HMAC over them and ``purpose`` (a value sealed for one use opens for no other)."""
    payload = base64.urlsafe_b64encode(json.dumps(values).encode()).decode()
    return f"{payload}.{_mac(key, f'{purpose}:{payload}'.encode())}"


def unseal_values(key: str, purpose: str, raw: str | None) -> list[Any] | None:
    if not raw or raw.count(".") != 1:
        return None
    payload, mac = raw.split(".")
    if not hmac.compare_digest(mac.encode(), _mac(key, f"{purpose}:{payload}".encode()).encode()):
        return None
    try:
        values = json.loads(base64.urlsafe_b64decode(payload.encode()))
    except ValueError:
        return None
    return values if isinstance(values, list) else None


def csrf_token(key: str, session: Session) -> str:
    return _mac(key, b"csrf:" + session.id.encode())


def csrf_ok(key: str, session: Session | None, given: str | None) -> bool:
    return session is not None and given is not None and hmac.compare_digest(given.encode(),
                                                                            csrf_token(key, session).encode())


def _mac(key: str, message: bytes) -> str:
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()
