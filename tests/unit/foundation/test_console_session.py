"""The console's session cookie opens only as sealed, under its key, before its end, and holds a
random id alone; CSRF tokens belong to one session."""

from __future__ import annotations

import base64
import json

from longrun.services.gateway import console_session as sessions

KEY = "k1"
NOW = 1_800_000_000.0


def test_a_sealed_session_opens_to_itself_until_it_ends() -> None:
    session = sessions.new(NOW)
    raw = sessions.seal(KEY, session)
    assert sessions.unseal(KEY, raw, NOW) == session
    assert sessions.unseal(KEY, raw, NOW + sessions.LIFETIME - 1) == session
    assert sessions.unseal(KEY, raw, NOW + sessions.LIFETIME) is None


def test_the_cookie_holds_the_session_id_and_its_end_and_nothing_else() -> None:
    session = sessions.new(NOW)
    payload = sessions.seal(KEY, session).split(".")[0]
    assert json.loads(base64.urlsafe_b64decode(payload)) == [session.id, session.expires]
    assert len(base64.urlsafe_b64decode(session.id + "=" * (-len(session.id) % 4))) == sessions.ID_BYTES


def test_an_altered_or_foreign_cookie_opens_to_nothing() -> None:
    raw = sessions.seal(KEY, sessions.new(NOW))
    payload, mac = raw.split(".")
    other = sessions.seal(KEY, sessions.new(NOW)).split(".")[0]
    for forged in (f"{other}.{mac}", f"{payload}.{'0' * len(mac)}", payload, "", None, "a.b.c", "!!.??", "é.ü"):
        assert sessions.unseal(KEY, forged, NOW) is None, forged
    assert sessions.unseal("another key", raw, NOW) is None


def test_a_sealed_cookie_of_another_shape_opens_to_nothing() -> None:
    for values in ([], ["id"], ["id", "tomorrow"], [7, int(NOW) + 60], ["nonce", "lrt_token", int(NOW) + 60]):
        assert sessions.unseal(KEY, sessions.seal_values(KEY, "session", values), NOW) is None, values


def test_a_csrf_token_is_good_for_its_session_only() -> None:
    mine, theirs = sessions.new(NOW), sessions.new(NOW)
    token = sessions.csrf_token(KEY, mine)
    assert sessions.csrf_ok(KEY, mine, token)
    assert not sessions.csrf_ok(KEY, theirs, token)
    assert not sessions.csrf_ok(KEY, mine, None)
    assert not sessions.csrf_ok(KEY, mine, "é" * 64)
    assert not sessions.csrf_ok(KEY, None, token)
    assert not sessions.csrf_ok("another key", mine, token)


def test_each_session_has_an_id_of_its_own() -> None:
    assert len({sessions.new(NOW).id for _ in range(100)}) == 100
