"""Tool and model calls: the default retry policy and the far sides' circuit breakers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longrun.config import parse
from longrun.config.declaration import Concern, Problem, setting
from longrun.domain.breaker import BreakerSettings
from longrun.domain.retry import RetryPolicy


@dataclass(frozen=True)
class CallSettings(Concern):
    """Calls: retries and circuit breakers"""

    retry_initial_interval: float = setting("LONGRUN_RETRY_INITIAL_INTERVAL", parse.positive_float,
                                            "seconds, a number > 0", "1")
    """Default retry policy of tool and model calls answered unavailable, and of steps whose run kind's
    ``decide`` or ``accept`` raised (a kind's own ``step_retry`` overrides it): seconds before the second
    attempt."""
    retry_backoff_coefficient: float = setting("LONGRUN_RETRY_BACKOFF_COEFFICIENT", parse.at_least_one_float,
                                               "a number >= 1", "2")
    """Default retry policy: each further delay is the previous one times this (1 keeps it constant)."""
    retry_maximum_interval: float = setting("LONGRUN_RETRY_MAXIMUM_INTERVAL", parse.positive_float,
                                            "seconds, a number > 0", "300")
    """Default retry policy: cap on any one delay, in seconds (at least the initial interval)."""
    retry_maximum_attempts: int = setting("LONGRUN_RETRY_MAXIMUM_ATTEMPTS", parse.positive_int, "an integer >= 1",
                                          "5")
    """Default retry policy: attempts in total, the first included; then the call is a recorded failure
    (a step that raised each time: NEEDS_ATTENTION)."""
    breaker_threshold: int = setting("LONGRUN_BREAKER_THRESHOLD", parse.positive_int, "an integer >= 1", "5")
    """Unavailable answers from one far side within ``LONGRUN_BREAKER_WINDOW`` that open its circuit breaker."""
    breaker_window: float = setting("LONGRUN_BREAKER_WINDOW", parse.positive_float, "seconds, a number > 0", "30")
    """Seconds over which a far side's unavailable answers are counted."""
    breaker_cool_down: float = setting("LONGRUN_BREAKER_COOL_DOWN", parse.positive_float, "seconds, a number > 0",
                                       "15")
    """Seconds an open breaker lets no call through; then one probe call goes (at most one per cool-down)."""
    breaker_cache: float = setting("LONGRUN_BREAKER_CACHE", parse.positive_float, "seconds, a number > 0", "1")
    """Seconds a worker trusts its copy of the breakers before reading them again (its own failures
    and probes update it at once)."""
    breaker_max_wait: float = setting("LONGRUN_BREAKER_MAX_WAIT", parse.positive_float, "seconds, a number > 0",
                                      "600")
    """Seconds a run waiting for a far side to be healthy, or for a permit of its tenant's tool group,
    waits at most before it looks again by itself."""

    def retry_policy(self) -> RetryPolicy:
        """The default retry policy of tool and model calls, and of steps whose kind's code raised."""
        return RetryPolicy(initial_interval=self.retry_initial_interval,
                           backoff_coefficient=self.retry_backoff_coefficient,
                           maximum_interval=self.retry_maximum_interval,
                           maximum_attempts=self.retry_maximum_attempts)

    def breaker(self) -> BreakerSettings:
        """The circuit breakers' settings (every far side's)."""
        return BreakerSettings(threshold=self.breaker_threshold, window=self.breaker_window,
                               cool_down=self.breaker_cool_down)

    @staticmethod
    def conflicts(values: Mapping[str, Any]) -> list[Problem]:
        if values["retry_maximum_interval"] < values["retry_initial_interval"]:
            return [("LONGRUN_RETRY_MAXIMUM_INTERVAL", f"got {values['retry_maximum_interval']}; expected at least "
                     f"LONGRUN_RETRY_INITIAL_INTERVAL ({values['retry_initial_interval']})")]
        return []
