"""Token buckets' pure arithmetic: a reservation is a place in line, reservations in any window of one
period never exceed the limit plus its burst, a refund and a far side's "not before" only move the level."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longrun.domain.rate_limit import (
    RATE_LIMIT_PREFIX,
    RATE_LIMIT_WAIT,
    Bucket,
    Charge,
    Per,
    RateLimit,
    Unit,
    empty,
    held,
    not_before,
    refund,
    reservation_wait,
    reserve,
)

TWENTY_PER_10S = RateLimit("forge", amount=20, period=10.0, burst=2)


def test_a_full_bucket_lets_its_burst_go_at_once_then_places_calls_one_refill_apart() -> None:
    b = empty("forge", TWENTY_PER_10S, 100.0)
    times = []
    for _ in range(5):
        placed = reserve([Charge(b, TWENTY_PER_10S, 1)], 100.0)
        (b,) = placed.buckets
        times.append(placed.go_at)
    assert times == pytest.approx([100.0, 100.0, 100.5, 101.0, 101.5])


def test_several_limits_give_one_time_the_latest_and_name_the_limit_that_set_it() -> None:
    tokens = RateLimit("model-tokens", amount=600, period=60.0, burst=100, unit=Unit.TOKENS)
    requests = RateLimit("model-requests", amount=10, period=60.0, burst=1)
    placed = reserve([Charge(empty("r", requests, 0.0), requests, 1),
                      Charge(Bucket("t", 0.0, 0.0), tokens, 100)], 0.0)
    assert placed.go_at == pytest.approx(10.0) and placed.binding == "model-tokens"
    r, t = placed.buckets
    assert placed.buckets == (Bucket("r", 1 - 1 - 10 * requests.rate, 0.0), Bucket("t", -100.0, 0.0))


def test_a_refund_gives_back_up_to_the_burst_and_a_retry_after_holds_the_next_place() -> None:
    b = Bucket("forge", -3.0, 10.0)
    assert refund(b, TWENTY_PER_10S, 10, 10.0).level == TWENTY_PER_10S.burst
    hold = not_before(empty("forge", TWENTY_PER_10S, 0.0), TWENTY_PER_10S, 0.0, 30.0)
    assert reserve([Charge(hold, TWENTY_PER_10S, 1)], 0.0).go_at == pytest.approx(30.0)
    assert held([hold, b], 10.0) == pytest.approx(20.0) and held([b], 10.0) == 0.0
    assert not_before(hold, TWENTY_PER_10S, 0.0, 5.0) == hold  # a shorter hold changes nothing


def test_a_hold_refills_nothing_so_the_calls_after_it_keep_to_the_rate() -> None:
    # Given an emptied bucket (2 per second, burst 2) that a 429 holds for 30 s
    hold = not_before(Bucket("forge", 0.0, 0.0), TWENTY_PER_10S, 0.0, 30.0)
    # When calls ask for their places while it holds, then when it ends
    places = []
    for now in (1.0, 10.0, 30.0, 30.0):
        placed = reserve([Charge(hold, TWENTY_PER_10S, 1)], now)
        (hold,) = placed.buckets
        places.append(placed.go_at)
    # Then they go one refill apart from its end: the 30 s of hold bought nobody a place
    assert places == pytest.approx([30.5, 31.0, 31.5, 32.0])


def test_a_per_tenant_limit_has_a_bucket_per_tenant_and_the_wait_shows_the_limit() -> None:
    per_tenant = RateLimit("model", amount=10, per=Per.TENANT)
    assert per_tenant.bucket("acme") == "model/acme" != per_tenant.bucket("globex")
    assert TWENTY_PER_10S.bucket("acme") == "forge"
    wait = reservation_wait(wait_id="w", limit_name="forge", logical_action="branch", wake_at=3.0)
    assert (wait.kind, wait.correlation_key, wait.wake_at, wait.deadline) == (RATE_LIMIT_WAIT,
                                                                             RATE_LIMIT_PREFIX + "forge", 3.0, 3.0)


def test_a_call_costing_more_than_a_period_and_the_burst_allow_is_refused() -> None:
    with pytest.raises(ValueError, match="costs 3 requests never fits: rate limit forge's burst .* is 2"):
        reserve([Charge(empty("forge", TWENTY_PER_10S, 0.0), TWENTY_PER_10S, 3)], 0.0)


@pytest.mark.parametrize("bad", [dict(name="", amount=1), dict(name="a:b", amount=1), dict(name="a", amount=0),
                                 dict(name="a", amount=1, period=0), dict(name="a", amount=1, burst=0)])
def test_a_limit_that_is_not_one_is_refused_naming_it(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="rate limit"):
        RateLimit(**bad)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(amount=st.integers(1, 50), burst=st.integers(1, 40), period=st.sampled_from([1.0, 10.0, 60.0]),
       calls=st.lists(st.tuples(st.floats(0, 30), st.integers(1, 40), st.integers(0, 40)), min_size=1, max_size=60))
def test_in_any_window_of_one_period_what_the_calls_used_never_exceeds_the_limit_plus_its_burst(
        amount: int, burst: int, period: float, calls: list[tuple[float, int, int]]) -> None:
    limit = RateLimit("x", amount=amount, period=period, burst=burst, unit=Unit.TOKENS)
    now, b = 0.0, empty("x", limit, 0.0)
    placed: list[tuple[float, float]] = []
    last = 0.0
    for gap, asked, unused in calls:
        cost = min(asked, burst)  # a call costing more never fits (``reserve`` refuses it)
        now += gap
        reservation = reserve([Charge(b, limit, cost)], now)
        (b,) = reservation.buckets
        assert reservation.go_at >= now and reservation.go_at >= last  # a place in line, in order
        last = reservation.go_at
        # The call goes at its time and gives back what it did not use when it answers.
        now = reservation.go_at
        used = max(0, cost - unused)
        placed.append((now, used))
        b = refund(b, limit, cost - used, now)
    for start, _ in placed:
        in_window = sum(c for t, c in placed if start <= t < start + period)
        assert in_window <= amount + burst + 1e-6, (start, in_window)


@settings(max_examples=300, deadline=None)
@given(amount=st.integers(1, 30), burst=st.integers(1, 5), clocks=st.lists(st.floats(-1, 3), min_size=1, max_size=80))
def test_a_clock_read_before_another_worker_s_reservation_never_lets_more_through(
        amount: int, burst: int, clocks: list[float]) -> None:
    # Each worker reads its clock, then waits for the bucket's lock: it may act at a time before the
    # last reservation's; the line still holds.
    limit = RateLimit("x", amount=amount, period=10.0, burst=burst)
    b, now, times = empty("x", limit, 0.0), 0.0, []
    for step in clocks:
        now = max(0.0, now + step)
        placed = reserve([Charge(b, limit, 1)], now)
        (b,) = placed.buckets
        times.append(placed.go_at)
    for start in times:
        assert sum(1 for t in times if start <= t < start + 10.0) <= amount + burst
