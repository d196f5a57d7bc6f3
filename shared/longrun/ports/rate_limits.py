"""The far sides' rate limits as the worker asks them (``domain.rate_limit``): token buckets shared by
every worker, asked only for calls to a far side that declares a limit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from longrun.domain.rate_limit import RateLimit


class RateLimits(Protocol):
    async def reserve(self, charges: Sequence[tuple[RateLimit, str, float]]) -> tuple[float, str]:
        """A place in line in each ``(limit, bucket, cost)``, for one time: (seconds from now until the
        call may go, 0 when it may go at once; the limit that set that time)."""

    async def refund(self, limit: RateLimit, bucket: str, amount: float) -> None:
        """``amount`` reserved in ``bucket`` was not used: given back."""

    async def not_before(self, limit: RateLimit, bucket: str, seconds: float) -> None:
        """The far side asked for nothing more for ``seconds`` (a 429's ``Retry-After``)."""

    async def held(self, buckets: Sequence[str]) -> float:
        """Seconds until the far side lets calls charged in ``buckets`` go again; 0 when nothing holds them."""
