"""Business retry delays: grow, are capped, stay within jitter bounds, and stop."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longrun.domain import RetryPolicy, next_delay, retryable


class Fixed:
    """An rng that always returns the same draw."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


policies = st.builds(
    RetryPolicy,
    initial_interval=st.floats(0.01, 10),
    backoff_coefficient=st.floats(1, 4),
    maximum_interval=st.floats(10, 1000),
    maximum_attempts=st.integers(1, 30),
    jitter=st.floats(0, 1),
)


def test_without_jitter_delays_grow_geometrically_until_the_cap() -> None:
    policy = RetryPolicy(
        initial_interval=1, backoff_coefficient=2, maximum_interval=10, maximum_attempts=7, jitter=0
    )
    delays = [next_delay(policy, attempt, rng=Fixed(0.5)) for attempt in range(1, 8)]
    assert delays == [1, 2, 4, 8, 10, 10, None]


def test_attempts_are_bounded_and_one_based() -> None:
    policy = RetryPolicy(maximum_attempts=1)
    assert next_delay(policy, 1, rng=Fixed(0.0)) is None
    with pytest.raises(ValueError, match="1-based"):
        next_delay(policy, 0, rng=Fixed(0.0))


def test_a_huge_attempt_number_does_not_overflow() -> None:
    policy = RetryPolicy(maximum_attempts=10**9, jitter=0)
    assert next_delay(policy, 10**6, rng=Fixed(0.0)) == policy.maximum_interval


@settings(max_examples=200, deadline=None, database=None)
@given(policy=policies, attempt=st.integers(1, 40), draw=st.floats(0, 1, exclude_max=True))
def test_delays_stay_within_jitter_of_the_capped_backoff(
    policy: RetryPolicy, attempt: int, draw: float
) -> None:
    delay = next_delay(policy, attempt, rng=Fixed(draw))
    if attempt >= policy.maximum_attempts:
        assert delay is None
        return
    base = min(policy.initial_interval * policy.backoff_coefficient ** (attempt - 1), policy.maximum_interval)
    assert delay is not None
    assert base * (1 - policy.jitter) - 1e-9 <= delay <= base + 1e-9
    assert delay <= policy.maximum_interval + 1e-9


@settings(max_examples=100, deadline=None, database=None)
@given(policy=policies.filter(lambda p: p.maximum_attempts > 2), seed=st.integers())
def test_jitterless_delays_never_shrink(policy: RetryPolicy, seed: int) -> None:
    steady = RetryPolicy(
        initial_interval=policy.initial_interval, backoff_coefficient=policy.backoff_coefficient,
        maximum_interval=policy.maximum_interval, maximum_attempts=policy.maximum_attempts, jitter=0,
    )  # fmt: skip
    rng = random.Random(seed)
    delays = [next_delay(steady, a, rng=rng) for a in range(1, steady.maximum_attempts)]
    assert all(d is not None for d in delays)
    assert delays == sorted(delays)  # type: ignore[type-var]


def test_the_same_seed_gives_the_same_delays() -> None:
    policy = RetryPolicy()
    first = [next_delay(policy, a, rng=random.Random(7)) for a in range(1, 5)]
    assert first == [next_delay(policy, a, rng=random.Random(7)) for a in range(1, 5)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_interval": 0},
        {"backoff_coefficient": 0.5},
        {"maximum_interval": 0.5},
        {"maximum_attempts": 0},
        {"jitter": 1.5},
    ],
)
def test_nonsense_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="invalid RetryPolicy"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_an_error_type_named_non_retryable_is_not_retried_by_class_or_base() -> None:
    policy = RetryPolicy(non_retryable_error_types=("QuotaExceeded",))
    assert retryable(policy, ["ToolUnavailable", "TransientError", "LongrunError", "Exception"])
    assert not retryable(policy, ["QuotaExceeded", "ToolUnavailable", "Exception"])
    assert retryable(RetryPolicy(), ["QuotaExceeded"])
