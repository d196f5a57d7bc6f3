"""The model provider's rate limits (a tool declares its own: ``Tool.rate_limits``)."""

from __future__ import annotations

from dataclasses import dataclass

from longrun.config import parse
from longrun.config.declaration import Concern, setting
from longrun.domain.rate_limit import Per, RateLimit, Unit

MODEL_REQUESTS = "model-requests"
MODEL_TOKENS = "model-tokens"


def _count(raw: str) -> int:
    value = int(raw)
    if value < 0 or value == 1:
        raise ValueError
    return value


def _per(raw: str) -> Per:
    return Per(raw)


@dataclass(frozen=True)
class RateLimitSettings(Concern):
    """Rate limits of the model provider"""

    model_requests_per_period: int = setting("LONGRUN_MODEL_REQUESTS_PER_PERIOD", _count,
                                             "an integer >= 2, or 0 for no limit", "0")
    """Model calls allowed in any ``LONGRUN_MODEL_RATE_PERIOD``; 0: no limit. One call may go at once
    after a quiet spell, then they are spaced evenly (docs/flow-control.md#rate-limits-per-far-side)."""
    model_tokens_per_period: int = setting("LONGRUN_MODEL_TOKENS_PER_PERIOD", _count,
                                           "an integer >= 2, or 0 for no limit", "0")
    """Model tokens (input plus ``LONGRUN_MODEL_MAX_TOKENS``, reserved before each call and the unused
    given back after) allowed in any ``LONGRUN_MODEL_RATE_PERIOD``; 0: no limit. One call may reserve
    at most a quarter of them."""
    model_rate_period: float = setting("LONGRUN_MODEL_RATE_PERIOD", parse.duration, parse.DURATION, "60")
    """The period the model's limits count over (a provider's "per minute": 60)."""
    model_rate_per: Per = setting("LONGRUN_MODEL_RATE_PER", _per, "key or tenant", "key")
    """key: one limit for every tenant's calls (the provider's limit on the platform's API key);
    tenant: each tenant has the whole limit to itself."""
    model_max_tokens: int = setting("LONGRUN_MODEL_MAX_TOKENS", parse.positive_int, "an integer >= 1", "1024")
    """The most tokens a model answer may use (``max_tokens``), sent with each call under a token limit."""

    def model_rate_limits(self) -> tuple[RateLimit, ...]:
        """The model's limits, each bounding what goes in any period to its number (the bucket's size
        and its refill add up to it)."""
        limits = []
        if self.model_requests_per_period:
            limits.append(RateLimit(MODEL_REQUESTS, amount=self.model_requests_per_period - 1,
                                    period=self.model_rate_period, burst=1, per=self.model_rate_per))
        if self.model_tokens_per_period:
            burst = max(1, self.model_tokens_per_period // 4)
            limits.append(RateLimit(MODEL_TOKENS, amount=self.model_tokens_per_period - burst,
                                    period=self.model_rate_period, burst=burst, unit=Unit.TOKENS,
                                    per=self.model_rate_per))
        return tuple(limits)
