"""The OIDC caches' decisions: when the JWKS is fetched again, and which discovery documents are taken."""

from __future__ import annotations

import json

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from longrun.oidc import Cached, KeySet, needs_fetch, refusal

ISSUER = "https://idp.example.test"


def _jwks(*kids: str) -> dict[str, object]:
    keys = []
    for kid in kids:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(
            rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()))
        keys.append({**public, "kid": kid, "alg": "RS256", "use": "sig"})
    return {"keys": keys}


@pytest.mark.parametrize(("cached", "known", "now", "fetch"), [
    (None, False, 0.0, True),
    (Cached({}, 0.0, 0.0), True, 99.0, False),
    (Cached({}, 0.0, 0.0), True, 100.0, True),
    (Cached({}, 0.0, 0.0), False, 9.0, False),
    (Cached({}, 0.0, 0.0), False, 10.0, True),
    (Cached({}, 0.0, 150.0), True, 155.0, False),
])
def test_the_jwks_is_fetched_when_missing_run_out_or_lacking_a_key_but_not_more_often_than_the_interval(
        cached: Cached | None, known: bool, now: float, fetch: bool) -> None:
    assert needs_fetch(cached, known=known, now=now, ttl=100.0, refresh_interval=10.0) is fetch


def test_a_key_set_refetches_for_a_new_key_id_at_most_once_per_interval_and_drops_keys_that_ran_out() -> None:
    served = {"set": _jwks("a")}
    calls: list[float] = []
    now = [0.0]

    def fetch(url: str) -> object:
        calls.append(now[0])
        return served["set"]

    keys = KeySet("https://idp.example.test/jwks", ttl=100.0, refresh_interval=10.0, fetch=fetch, clock=lambda: now[0])
    assert keys.key("a").key_id == "a"
    served["set"] = _jwks("b")
    now[0] = 5.0
    with pytest.raises(jwt.PyJWKClientError):
        keys.key("b")
    assert keys.key("a").key_id == "a"
    now[0] = 11.0
    assert keys.key("b").key_id == "b"
    with pytest.raises(jwt.PyJWKClientError):
        keys.key("a")
    assert calls == [0.0, 11.0]


def test_a_failing_issuer_is_asked_at_most_once_per_interval() -> None:
    now = [0.0]
    calls: list[float] = []

    def fetch(url: str) -> object:
        calls.append(now[0])
        raise ValueError("not JSON")

    keys = KeySet("https://idp.example.test/jwks", ttl=100.0, refresh_interval=10.0, fetch=fetch, clock=lambda: now[0])
    for t in (0.0, 1.0, 9.0, 10.0):
        now[0] = t
        with pytest.raises(jwt.PyJWKClientError):
            keys.key("a")
    assert calls == [0.0, 10.0]


def test_a_discovery_document_is_taken_only_for_the_configured_issuer() -> None:
    good = {"issuer": ISSUER, "authorization_endpoint": f"{ISSUER}/a", "token_endpoint": f"{ISSUER}/t"}
    assert refusal(good, ISSUER) is None
    assert "not the configured" in str(refusal({**good, "issuer": "https://impostor.example.test"}, ISSUER))
    assert "not the configured" in str(refusal({**good, "issuer": ISSUER + "/"}, ISSUER))
    assert "no authorization" in str(refusal({"issuer": ISSUER}, ISSUER))
    assert "not a JSON object" in str(refusal([good], ISSUER))
