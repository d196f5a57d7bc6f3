"""The console's session cookie opens only as sealed, under its key, before its end; CSRF tokens
belong to one session."""

from __future__ import annotations

from services.gateway import console_session as sessions

KEY = "k1"
NOW = 1_800_000_000.0


def test_a_sealed_session_opens_to_itself_until_it_ends() -> None:
    session = sessions.signed_in("tok", NOW)
    raw = sessions.seal(KEY, session)
    assert sessions.unseal(KEY, raw, NOW) == session
    assert sessions.unseal(KEY, raw, NOW + sessions.LIFETIME - 1) == session
    assert sessions.unseal(KEY, raw, NOW + sessions.LIFETIME) is None


def test_an_altered_or_foreign_cookie_opens_to_nothing() -> None:
    raw = sessions.seal(KEY, sessions.signed_in("tok", NOW))
    payload, mac = raw.split(".")
    other = sessions.seal(KEY, sessions.signed_in("admin-token", NOW)).split(".")[0]
    for forged in (f"{other}.{mac}", f"{payload}.{'0' * len(mac)}", payload, "", None, "a.b.c", "!!.??", "é.ü"):
        assert sessions.unseal(KEY, forged, NOW) is None, forged
    assert sessions.unseal("another key", raw, NOW) is None


def test_a_csrf_token_is_good_for_its_session_only() -> None:
    mine, theirs = sessions.anonymous(NOW), sessions.anonymous(NOW)
    token = sessions.csrf_token(KEY, mine)
    assert sessions.csrf_ok(KEY, mine, token)
    assert not sessions.csrf_ok(KEY, theirs, token)
    assert not sessions.csrf_ok(KEY, mine, None)
    assert not sessions.csrf_ok(KEY, mine, "é" * 64)
    assert not sessions.csrf_ok(KEY, None, token)
    assert not sessions.csrf_ok("another key", mine, token)


def test_signing_in_issues_a_new_nonce() -> None:
    before = sessions.anonymous(NOW)
    after = sessions.signed_in("tok", NOW)
    assert after.nonce != before.nonce and after.token == "tok" and before.token is None
