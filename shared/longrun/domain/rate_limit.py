"""Rate limits per far side: token buckets as data plus pure arithmetic.

Responsibility: decide when a call to a rate-limited far side may go. A far side (a tool, or the
model provider) declares ``RateLimit``s; storage keeps one ``Bucket`` per limit (per tenant, or one
for the whole platform: ``Per``), shared by every worker, and applies these functions under the
row's lock with the database's clock.

Invariants:
- A bucket refills at ``amount / period`` per second up to ``burst``; its level may go below zero.
- A reservation is a place in line, never a retry: it takes its cost at once and gets the time at
  which the level it leaves is back to zero (``reserve``). Reservations made one after the other get
  times one cost's refill apart: nothing is asked again, and no herd goes at a refill.
- Several limits on one call (requests and tokens) are reserved for one time, the latest any of
  them allows, each bucket charged for that time: so in any window of ``period`` seconds, the calls
  (or tokens) reserved for times inside it are at most ``amount + burst``.
- A refund (tokens reserved but not used) only moves a bucket's level. A far side's "not before"
  (a 429's ``Retry-After``) holds every place in line, given or not, until then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

from longrun.domain.snapshot import Wait

RATE_LIMIT_WAIT = "rate_limit"
"""The wait kind (reason) of a run whose call waits for its reservation's time."""
RATE_LIMIT_PREFIX = "rate_limit:"
"""A waiting run shows ``waiting_for: rate_limit:<limit name>``; its wait's correlation key is that."""
RESERVATION_FACT_PREFIX = "rate_limit:"
"""The fact ``rate_limit:<logical action>`` holds the call's reservation while it waits for it."""


class Unit(str, Enum):
    REQUESTS = "requests"
    TOKENS = "tokens"
    """Model tokens: a call's input tokens plus its ``max_tokens``, refunded down to what it used."""


class Per(str, Enum):
    KEY = "key"
    """One bucket for every tenant's calls: the far side's limit on the platform's one API key."""
    TENANT = "tenant"
    """One bucket per tenant."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    name: str
    """Names the limit's buckets, its metrics and what a run waiting for it shows."""
    amount: int
    """Requests (or tokens) per ``period``."""
    period: float = 60.0
    """Seconds."""
    burst: int = 1
    """The bucket's size: what a full bucket lets go at once, and the most one call may cost (a
    model call's input plus ``max_tokens``). In any ``period`` seconds, at most ``amount + burst``
    requests (or tokens) are reserved."""
    unit: Unit = Unit.REQUESTS
    per: Per = Per.KEY

    def __post_init__(self) -> None:
        if not self.name or ":" in self.name:
            raise ValueError(f"rate limit name {self.name!r}: expected a non-empty name without ':'")
        if self.amount < 1 or not self.period > 0 or self.burst < 1:
            raise ValueError(f"rate limit {self.name!r}: amount {self.amount} must be >= 1, period "
                             f"{self.period} > 0 and burst {self.burst} >= 1")

    @property
    def rate(self) -> float:
        """Refill per second."""
        return self.amount / self.period

    def bucket(self, tenant_id: str) -> str:
        """The bucket a call of ``tenant_id`` is charged in."""
        return f"{self.name}/{tenant_id}" if self.per is Per.TENANT else self.name


@dataclass(frozen=True, slots=True)
class Bucket:
    key: str
    level: float
    """Requests (or tokens) left as of ``at``; below zero: owed to reservations already given."""
    at: float
    """Epoch seconds the level is as of; it never moves back (a clock read before it counts as it)."""
    hold_until: float = 0.0
    """Epoch seconds before which nothing goes: the far side's "not before" (a 429's ``Retry-After``)."""


def empty(key: str, limit: RateLimit, now: float) -> Bucket:
    """A bucket never used: full."""
    return Bucket(key, float(limit.burst), now)


def level_at(b: Bucket, limit: RateLimit, t: float) -> float:
    """The level at ``t``: refilled since ``b.at``, up to ``burst``."""
    return min(float(limit.burst), b.level + max(0.0, t - b.at) * limit.rate)


def earliest(b: Bucket, limit: RateLimit, cost: float, now: float) -> float:
    """The first time from ``now`` at which the refill has paid for ``cost`` taken now."""
    now = max(now, b.at)
    return max(b.hold_until, now + max(0.0, cost - level_at(b, limit, now)) / limit.rate)


@dataclass(frozen=True, slots=True)
class Charge:
    """One limit's part of a call: its bucket as read, the limit and the cost."""

    bucket: Bucket
    limit: RateLimit
    cost: float


@dataclass(frozen=True, slots=True)
class Reservation:
    go_at: float
    """When the call may go: ``now`` when every bucket had its cost."""
    buckets: tuple[Bucket, ...]
    """Each bucket after it gave the call its place, for ``go_at``."""
    binding: str
    """The limit that set ``go_at``: the one a waiting run shows."""


def reserve(charges: Sequence[Charge], now: float) -> Reservation:
    """The call's place in line in every bucket it is charged in, for one time: the latest any of
    them allows. A bucket that would have let it go sooner is charged as if it went at that time
    too (the refill of the difference goes to this call), so every bucket counts the call when it goes."""
    if not charges:
        raise ValueError("a reservation needs at least one charge")
    for c in charges:
        if c.cost > c.limit.burst:
            raise ValueError(f"a call that costs {c.cost:g} {c.limit.unit.value} never fits: rate limit "
                             f"{c.limit.name}'s burst (its bucket's size) is {c.limit.burst}")
    times = [earliest(c.bucket, c.limit, c.cost, now) for c in charges]
    go = max(times)
    binding = charges[times.index(go)].limit.name
    return Reservation(go, tuple(
        replace(c.bucket, level=level_at(c.bucket, c.limit, now) - c.cost - (go - t) * c.limit.rate,
                at=max(now, c.bucket.at))
        for c, t in zip(charges, times)), binding)


def refund(b: Bucket, limit: RateLimit, amount: float, now: float) -> Bucket:
    """The bucket after ``amount`` reserved was not used: given back, up to the bucket's size."""
    if amount <= 0:
        return b
    return replace(b, level=min(float(limit.burst), level_at(b, limit, now) + amount), at=max(now, b.at))


def not_before(b: Bucket, limit: RateLimit, now: float, seconds: float) -> Bucket:
    """The bucket after the far side said "not for ``seconds``" (a 429's ``Retry-After``): no place
    in line before then; a call whose place came sooner waits for it too (``held``). Nothing refills
    while it holds (its level now is its level when the hold ends): a refill over the hold would give
    every call placed during it the hold's end at once, past the rate."""
    until = now + seconds
    if until <= b.hold_until:
        return b
    return replace(b, level=level_at(b, limit, max(now, b.at)), at=max(b.at, until), hold_until=until)


def held(buckets: Sequence[Bucket], now: float) -> float:
    """Seconds from ``now`` the far side said nothing may go; 0 when nothing holds."""
    return max([0.0, *(b.hold_until - now for b in buckets)])


def reservation_wait(*, wait_id: str, limit_name: str, logical_action: str, wake_at: float) -> Wait:
    """The wait of a run whose call has its place in line: only its own timer ends it, at ``wake_at``."""
    return Wait(wait_id=wait_id, kind=RATE_LIMIT_WAIT, deadline=wake_at, wake_at=wake_at,
                correlation_key=f"{RATE_LIMIT_PREFIX}{limit_name}", subject=logical_action)

