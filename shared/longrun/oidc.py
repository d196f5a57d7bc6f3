"""What the gateway keeps of its OIDC issuer: the signing keys (JWKS) and the discovery document.

Both are cached for ``LONGRUN_OIDC_CACHE_TTL`` and fetched again once it runs out, so a key the
issuer withdrew stops verifying tokens within that time. A token naming a key id the cache does not
hold (the issuer rotated its keys) fetches the keys again at once, but at most once every
``LONGRUN_OIDC_REFRESH_INTERVAL``: a stream of tokens with made-up key ids cannot make the gateway
hammer the issuer. The discovery document is taken only when its ``issuer`` is the configured one
(OpenID Connect Discovery 1.0, section 4.3): a document that names another issuer is refused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import jwt

TIMEOUT = 5.0
"""Seconds a fetch from the issuer may take; past them the token or the sign-in is refused."""


@dataclass(frozen=True, slots=True)
class Cached:
    """What was fetched last, when, and when the last fetch was tried (it may have failed)."""

    value: Any
    fetched_at: float
    tried_at: float


def needs_fetch(cached: Cached | None, *, known: bool, now: float, ttl: float, refresh_interval: float) -> bool:
    """Whether to fetch again: nothing is cached, what is cached has run out, or it lacks what is
    asked for (``known`` False) and the last try is ``refresh_interval`` old."""
    if cached is None or now - cached.fetched_at >= ttl:
        return cached is None or now - cached.tried_at >= min(refresh_interval, ttl)
    return not known and now - cached.tried_at >= refresh_interval


def fresh(cached: Cached | None, *, now: float, ttl: float) -> Any:
    """The cached value while it is in date, else None."""
    return cached.value if cached is not None and now - cached.fetched_at < ttl else None


class KeySet:
    """The issuer's JWKS by key id (blocking: used from a worker thread)."""

    def __init__(self, url: str, *, ttl: float, refresh_interval: float,
                 fetch: Callable[[str], Any] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._url = url
        self._ttl = ttl
        self._refresh_interval = refresh_interval
        self._fetch = fetch or _get_json
        self._clock = clock
        self._cached: Cached | None = None
        self._lock = threading.Lock()

    def key(self, kid: str | None) -> jwt.PyJWK:
        """The in-date key ``kid`` names; ``jwt.PyJWKClientError`` when there is none."""
        with self._lock:
            now = self._clock()
            keys = fresh(self._cached, now=now, ttl=self._ttl) or {}
            if needs_fetch(self._cached, known=kid in keys, now=now, ttl=self._ttl,
                           refresh_interval=self._refresh_interval):
                keys = self._refreshed(now)
        if kid not in keys:
            raise jwt.PyJWKClientError(f"no signing key {kid!r} in the issuer's JWKS")
        return keys[kid]  # type: ignore[no-any-return]

    def _refreshed(self, now: float) -> dict[str | None, jwt.PyJWK]:
        try:
            keys = {k.key_id: k for k in jwt.PyJWKSet.from_dict(self._fetch(self._url)).keys}
        except (httpx.HTTPError, ValueError, jwt.PyJWKError, jwt.PyJWKSetError) as e:
            stale = self._cached or Cached({}, float("-inf"), now)
            self._cached = Cached(stale.value, stale.fetched_at, now)
            raise jwt.PyJWKClientError(f"the issuer's JWKS ({self._url}) could not be read: {e}") from e
        self._cached = Cached(keys, now, now)
        return keys


class DiscoveryFailed(Exception):
    """The discovery document could not be read, or is not the configured issuer's; the message says which."""


class Discovery:
    """The issuer's discovery document (``/.well-known/openid-configuration``), cached."""

    def __init__(self, issuer: str, *, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.issuer = issuer
        self.ttl = ttl
        self._clock = clock
        self._cached: Cached | None = None

    async def document(self) -> dict[str, Any]:
        now = self._clock()
        kept = fresh(self._cached, now=now, ttl=self.ttl)
        if kept is not None:
            return kept  # type: ignore[no-any-return]
        url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
        try:
            async with httpx.AsyncClient(timeout=TIMEOUT) as http:
                answer = await http.get(url)
                answer.raise_for_status()
                document = answer.json()
        except (httpx.HTTPError, ValueError) as e:
            raise DiscoveryFailed(f"the issuer's discovery document ({url}) could not be read: {e}") from e
        refused = refusal(document, self.issuer)
        if refused:
            raise DiscoveryFailed(f"the issuer's discovery document ({url}) {refused}")
        self._cached = Cached(document, now, now)
        return document  # type: ignore[no-any-return]


def refusal(document: Any, issuer: str) -> str | None:
    """Why a discovery document is not to be used for ``issuer``, or None."""
    if not isinstance(document, dict):
        return "is not a JSON object"
    if document.get("issuer") != issuer:
        return f"names the issuer {str(document.get('issuer'))[:200]!r}, not the configured {issuer!r}"
    if not all(isinstance(document.get(k), str) for k in ("authorization_endpoint", "token_endpoint")):
        return "names no authorization and token endpoints"
    return None


def _get_json(url: str) -> Any:
    answer = httpx.get(url, timeout=TIMEOUT)
    answer.raise_for_status()
    return answer.json()
