"""The far sides' token buckets in memory (``ports.rate_limits.RateLimits``) on the world's clock: the
same arithmetic (``domain.rate_limit``) as ``db.rate_limits``, one dict for every worker of a world."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from longrun.domain import rate_limit as buckets
from longrun.domain.rate_limit import Bucket, Charge, RateLimit


class MemoryRateLimits:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.buckets: dict[str, Bucket] = {}

    def _bucket(self, limit: RateLimit, key: str, now: float) -> Bucket:
        return self.buckets.get(key) or buckets.empty(key, limit, now)

    async def reserve(self, charges: Sequence[tuple[RateLimit, str, float]]) -> tuple[float, str]:
        now = self.clock()
        placed = buckets.reserve([Charge(self._bucket(limit, key, now), limit, cost) for limit, key, cost in charges],
                                 now)
        self.buckets.update((b.key, b) for b in placed.buckets)
        return placed.go_at - now, placed.binding

    async def refund(self, limit: RateLimit, bucket: str, amount: float) -> None:
        now = self.clock()
        self.buckets[bucket] = buckets.refund(self._bucket(limit, bucket, now), limit, amount, now)

    async def not_before(self, limit: RateLimit, bucket: str, seconds: float) -> None:
        now = self.clock()
        self.buckets[bucket] = buckets.not_before(self._bucket(limit, bucket, now), limit, now, seconds)

    async def held(self, bucket_keys: Sequence[str]) -> float:
        return buckets.held([self.buckets[key] for key in bucket_keys if key in self.buckets], self.clock())
