"""Business retry policy: exponential backoff with jitter, as data plus one pure function.

Responsibility: compute how long a run waits before its next attempt. The delay becomes
a timer row that the timer service fires; no worker ever sleeps on it.

Invariants:
- ``next_delay`` is deterministic given the rng: randomness comes in as an argument.
- Before jitter, delays grow by ``backoff_coefficient`` and are capped at
  ``maximum_interval``; jitter only shortens a delay (by at most ``jitter`` of it), so
  the cap holds after jitter too.
- After ``maximum_attempts`` attempts there is no next delay; an error whose type is named in
  ``non_retryable_error_types`` is not retried at all (``retryable``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Collection
from typing import Protocol


class Rng(Protocol):
    """The part of ``random.Random`` the domain uses; pass a seeded instance in."""

    def random(self) -> float: ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    initial_interval: float = 1.0
    """Seconds to wait after the first failed attempt."""
    backoff_coefficient: float = 2.0
    """Each further delay is the previous one times this; 1.0 means a constant delay."""
    maximum_interval: float = 300.0
    """Cap on any single delay, in seconds."""
    maximum_attempts: int = 5
    """Attempts in total, the first included. Business retries are always bounded."""
    jitter: float = 0.2
    """Fraction of each delay that may be randomly removed, so runs that failed together
    do not all wake in the same second."""
    non_retryable_error_types: tuple[str, ...] = ()
    """Names of error types (a class or any of its bases, e.g. a tool's own ``ToolUnavailable``
    subclass) that end the call at once instead of being retried."""

    def __post_init__(self) -> None:
        problems = [
            msg
            for bad, msg in (
                (self.initial_interval <= 0, "initial_interval must be > 0"),
                (self.backoff_coefficient < 1, "backoff_coefficient must be >= 1"),
                (self.maximum_interval < self.initial_interval, "maximum_interval must be >= initial"),
                (self.maximum_attempts < 1, "maximum_attempts must be >= 1"),
                (not 0 <= self.jitter <= 1, "jitter must be within [0, 1]"),
            )
            if bad
        ]
        if problems:
            raise ValueError("invalid RetryPolicy: " + "; ".join(problems))


def next_delay(policy: RetryPolicy, attempt: int, *, rng: Rng) -> float | None:
    """Seconds to wait after ``attempt`` (1-based) failed, or None when attempts are used up."""
    if attempt < 1:
        raise ValueError(f"attempt is 1-based, got {attempt}")
    if attempt >= policy.maximum_attempts:
        return None
    exponent = attempt - 1
    # Compare in log space so huge attempt numbers cannot overflow the power.
    headroom = math.log(policy.maximum_interval / policy.initial_interval)
    if exponent * math.log(policy.backoff_coefficient) < headroom:
        base = min(policy.initial_interval * policy.backoff_coefficient**exponent, policy.maximum_interval)
    else:
        base = policy.maximum_interval
    return base * (1.0 - policy.jitter * rng.random())



def retryable(policy: RetryPolicy, error_types: Collection[str]) -> bool:
    """Whether an error whose class and bases are named ``error_types`` is retried at all."""
    return not any(name in policy.non_retryable_error_types for name in error_types)
