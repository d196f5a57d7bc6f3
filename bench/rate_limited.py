"""What one rate-limited call costs: its place in line and what it gives back, on PostgreSQL.

The call is a model call under both of the model's limits, built as the settings build them
(``LONGRUN_MODEL_REQUESTS_PER_PERIOD`` and ``LONGRUN_MODEL_TOKENS_PER_PERIOD``, one bucket each for
the platform's key): ``PgRateLimits.reserve`` charges both buckets in one transaction before the
call, ``refund`` gives the token bucket back what the answer did not use in another after it. That
is everything a limited call adds to a step that goes at once (a call that must wait adds its
run's park and wake, which the ensemble's figures price). The limits are far above what is asked
of them, so no call waits: the bookkeeping is measured, not a place's wait. One call at a time
gives the latency alone; ``CONCURRENT`` at once take their places in the same two rows, whose
locks queue them, as every worker's calls to one provider queue.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.common import percentiles
from bench.infra import Infra
from longrun.config.rate_limits import RateLimitSettings
from longrun.db.rate_limits import PgRateLimits
from longrun.domain.rate_limit import Per, RateLimit, Unit

CONCURRENT = 16
"""Calls in flight at once in the concurrent measurement (as many as the Python transaction loop's connections)."""
TOKENS_RESERVED, TOKENS_USED = 3_000, 1_000
"""A call's reservation (its input's bound plus ``max_tokens``) and what its answer used."""


def model_limits() -> tuple[RateLimit, ...]:
    """The model's two limits, far above what the bench asks of them."""
    return RateLimitSettings(model_requests_per_period=10**9, model_tokens_per_period=10**12, model_rate_period=60.0,
                             model_rate_per=Per.KEY, model_max_tokens=1024).model_rate_limits()


async def cost(infra: Infra, *, calls: int) -> dict[str, Any]:
    """``calls`` limited calls one after the other, then as many again ``CONCURRENT`` at once."""
    engine = infra.engine(CONCURRENT)
    try:
        buckets = PgRateLimits(engine)
        limits = model_limits()
        await _calls(buckets, limits, CONCURRENT, CONCURRENT)  # the bucket rows exist, the pool is open
        return {"limits": [limit.name for limit in limits],
                "sequential": await _calls(buckets, limits, calls, 1),
                "concurrent": await _calls(buckets, limits, calls, CONCURRENT)}
    finally:
        await engine.dispose()


async def _calls(buckets: PgRateLimits, limits: tuple[RateLimit, ...], calls: int, at_once: int) -> dict[str, Any]:
    charges = [(limit, limit.bucket("bench"), float(TOKENS_RESERVED if limit.unit is Unit.TOKENS else 1))
               for limit in limits]
    counted = [limit for limit in limits if limit.unit is Unit.TOKENS]
    reserve_ms: list[float] = []
    refund_ms: list[float] = []
    call_ms: list[float] = []
    waited = 0

    async def one() -> None:
        nonlocal waited
        t0 = time.perf_counter()
        wait, _ = await buckets.reserve(charges)
        t1 = time.perf_counter()
        for limit in counted:
            await buckets.refund(limit, limit.bucket("bench"), TOKENS_RESERVED - TOKENS_USED)
        t2 = time.perf_counter()
        waited += wait > 0
        reserve_ms.append((t1 - t0) * 1000)
        refund_ms.append((t2 - t1) * 1000)
        call_ms.append((t2 - t0) * 1000)

    async def caller(share: int) -> None:
        for _ in range(share):
            await one()

    started = time.perf_counter()
    await asyncio.gather(*(caller(calls // at_once + (k < calls % at_once)) for k in range(at_once)))
    elapsed = time.perf_counter() - started
    return {"calls": calls, "at_once": at_once, "calls_per_s": round(calls / elapsed), "waited": waited,
            "call_ms": _rounded(percentiles(call_ms)), "reserve_ms": _rounded(percentiles(reserve_ms)),
            "refund_ms": _rounded(percentiles(refund_ms))}


def _rounded(stats: dict[str, float | None]) -> dict[str, float | None]:
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in stats.items()}
