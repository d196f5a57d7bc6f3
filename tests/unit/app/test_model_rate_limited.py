"""What a model server's 429 asks to wait, read from Retry-After or the rate-limit reset headers, and
the input tokens a call can use at most."""

from __future__ import annotations

import time
from email.utils import formatdate

import pytest

from longrun.model import MESSAGE_OVERHEAD_TOKENS, input_tokens_bound, messages, retry_after


@pytest.mark.parametrize(("headers", "seconds"), [
    ({"retry-after": "3"}, 3.0),
    ({"retry-after": "0.5"}, 0.5),
    ({"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "6m0s"}, 360.0),
    ({"x-ratelimit-reset-tokens": "250ms"}, 0.25),
    ({"x-ratelimit-reset-tokens": "soon"}, None),
    ({}, None),
])
def test_a_429_says_how_long_to_wait(headers: dict[str, str], seconds: float | None) -> None:
    assert retry_after(headers) == seconds


def test_a_retry_after_date_is_read_as_the_seconds_until_it() -> None:
    waited = retry_after({"retry-after": formatdate(time.time() + 30, usegmt=True)})
    assert waited is not None and 28 <= waited <= 30


def test_the_input_bound_counts_every_byte_sent_and_the_template_around_each_message() -> None:
    context = {"goal": "migrate to 5.0 — naïvely", "stage": "plan"}
    sent = messages(context, ["finish"])
    assert input_tokens_bound(context, ["finish"]) == (sum(len(m["content"].encode()) for m in sent)
                                                       + MESSAGE_OVERHEAD_TOKENS * (len(sent) + 1))
