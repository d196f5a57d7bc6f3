"""Leases and fencing tokens: who may advance a run, and whose writes still count.

Responsibility: the pure rules behind run (and partition) leases. Storage applies them
atomically; this module only says what the next lease is and whether a write is stale.

Invariants:
- A lease is not a lock. Its expiry only says when another owner may take over; the
  fencing token is what rejects a stale owner's writes, whatever its own clock says.
- The token grows by exactly one on every takeover and never goes back, so a released
  lease is kept as an expired lease (``release``) rather than forgotten.
- Renewal extends a live lease for its owner and keeps the token.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Lease:
    owner: str
    until: float
    """Epoch seconds after which another owner may take over."""
    fencing_token: int


def can_take(current: Lease | None, now: float) -> bool:
    """True when nobody holds a live lease at ``now`` (None means never leased)."""
    return current is None or now >= current.until


def takeover(current: Lease | None, owner: str, *, now: float, ttl: float) -> Lease:
    """The lease ``owner`` gets by taking over; ValueError if a live lease is in the way."""
    if ttl <= 0:
        raise ValueError(f"ttl must be > 0, got {ttl}")
    if current is not None and not can_take(current, now):
        raise ValueError(f"lease held by {current.owner} until {current.until}; cannot take it at {now}")
    token = 1 if current is None else current.fencing_token + 1
    return Lease(owner, now + ttl, token)


def renew(current: Lease, owner: str, *, now: float, ttl: float) -> Lease:
    """Extend a live lease held by ``owner``; the token stays, the expiry never shrinks."""
    if ttl <= 0:
        raise ValueError(f"ttl must be > 0, got {ttl}")
    if current.owner != owner or now >= current.until:
        held = f"held by {current.owner} until {current.until}"
        raise ValueError(f"{owner} does not hold a live lease ({held})")
    return Lease(owner, max(current.until, now + ttl), current.fencing_token)


def release(current: Lease, *, now: float) -> Lease:
    """Give the lease up early: it expires at ``now`` and keeps its token for the next takeover."""
    return Lease(current.owner, min(current.until, now), current.fencing_token)


def is_stale(token: int, current_token: int) -> bool:
    """True when a write carrying ``token`` must be rejected.

    Only the current token is accepted. A larger token cannot have been issued, so it is
    treated as stale too rather than trusted.
    """
    return token != current_token


LEASE_EXPIRED = "lease_expired"
"""A run recovered by the reconciler: its lease expired, and it was woken again."""
MEMBER_LAPSED = "member_lapsed"
"""A run recovered by a worker: its holder's membership lapsed, and it was taken over at once."""
_CAUSES = {LEASE_EXPIRED: "lease-expired", MEMBER_LAPSED: "member-lapsed"}


def recovery_cause(reason: str, owner: str, token: int) -> str:
    """What a run's recovery (``LEASE_EXPIRED`` or ``MEMBER_LAPSED``) names as its cause: the lost lease."""
    return f"{_CAUSES[reason]}:{owner}:{token}"


def recovered_by(cause: str | None) -> str | None:
    """How a turn caused by ``cause`` recovers its run from a lost worker (``recovery_cause``); None: it does not."""
    if cause is not None:
        for reason, prefix in _CAUSES.items():
            if cause.startswith(prefix + ":"):
                return reason
    return None
