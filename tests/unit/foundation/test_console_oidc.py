"""The console's OIDC sign-in: the PKCE challenge is RFC 7636's, and an attempt's cookie opens only
as sealed, for sign-in, within its patience."""

from __future__ import annotations

from longrun.services.gateway import console_oidc as oidc
from longrun.services.gateway import console_session as sessions

NOW = 1_800_000_000.0


def test_the_pkce_challenge_is_the_rfc_7636_one() -> None:
    attempt = oidc.Attempt("state", "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk")
    assert attempt.challenge() == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


def test_an_attempt_opens_as_sealed_until_its_patience_runs_out() -> None:
    attempt = oidc.Attempt.new()
    raw = oidc.seal("k", attempt, NOW)
    assert oidc.unseal("k", raw, NOW + oidc.PATIENCE - 1) == attempt
    assert oidc.unseal("k", raw, NOW + oidc.PATIENCE) is None
    assert oidc.unseal("other key", raw, NOW) is None


def test_a_session_cookie_is_no_attempt_and_an_attempt_no_session() -> None:
    session = sessions.seal("k", sessions.new(NOW))
    assert oidc.unseal("k", session, NOW) is None
    assert sessions.unseal("k", oidc.seal("k", oidc.Attempt.new(), NOW), NOW) is None
