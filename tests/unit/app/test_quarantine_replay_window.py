"""A quarantine replay past the replay window: when the inbox may no longer hold the message's row."""

from __future__ import annotations

from datetime import timedelta

import pytest

from longrun.envelope import make
from longrun.services.gateway.quarantine import NotReplayable, already_applied, past_window

WINDOW = 3600.0


def _create():  # type: ignore[no-untyped-def]
    return make("run.create", {"workflow": "steps", "idempotency_key": "k", "input": {}}, producer="tests",
                tenant_id="acme")


def test_a_message_is_past_the_window_by_the_earlier_of_when_it_was_sent_and_when_it_first_failed() -> None:
    envelope = _create()
    sent = envelope.occurred_at
    assert not past_window(envelope, sent, sent + timedelta(seconds=WINDOW), WINDOW)
    assert past_window(envelope, sent, sent + timedelta(seconds=WINDOW + 1), WINDOW)
    # a sender whose clock runs late cannot make an old message look young
    assert past_window(envelope, sent - timedelta(days=1), sent + timedelta(seconds=1), WINDOW)


async def test_a_message_of_a_type_nothing_outlives_the_inbox_for_is_refused_past_the_window() -> None:
    other = _create().model_copy(update={"type": "run.accepted"})
    with pytest.raises(NotReplayable, match="a run.accepted older than the replay window cannot be checked"):
        await already_applied(None, other)  # type: ignore[arg-type]
