"""Schedules: a run kind's runs created on a cron expression or an interval (``longrun.cadence`` says
when each is due).

What fires when the timer service looks (``plan_firing``): the due times up to now, oldest first, at most
``per_round`` of them; those older than the catch-up window (the service was down for a while) are not
fired but recorded as missed, as one range. Each due time makes at most one run: its idempotency key
names the schedule and the time.

The overlap policy is a concurrency key of limit one named after the schedule (``overlap_key``), applied
by admission like any kind's key.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from longrun.domain.concurrency import KeyPolicy


class Overlap(enum.StrEnum):
    """What a due time does while the schedule's earlier run is still open."""

    SKIP = "skip"
    """No run: the due time is recorded as skipped (the key's ``REFUSE``)."""
    BUFFER_ONE = "buffer_one"
    """One run waits for the open one to end; a further one is skipped (``QUEUE``, ``max_waiting=1``)."""
    CANCEL_PREVIOUS = "cancel_previous"
    """The open run is asked to cancel; the new one starts once it has ended (``CANCEL_IN_PROGRESS``)."""
    ALLOW = "allow"
    """Runs overlap freely: no key."""


@dataclass(frozen=True, slots=True)
class OverlapKey:
    """The concurrency key a schedule's runs take: limit one, the policy and how many may wait."""

    key: str
    policy: KeyPolicy
    max_waiting: int | None


def overlap_key(schedule_id: str, overlap: Overlap) -> OverlapKey | None:
    if overlap is Overlap.ALLOW:
        return None
    policy = {Overlap.SKIP: KeyPolicy.REFUSE, Overlap.BUFFER_ONE: KeyPolicy.QUEUE,
              Overlap.CANCEL_PREVIOUS: KeyPolicy.CANCEL_IN_PROGRESS}[overlap]
    return OverlapKey(f"schedule:{schedule_id}", policy, 1 if overlap is Overlap.BUFFER_ONE else None)


class Instant(Protocol):
    def __lt__(self, other: Any, /) -> bool: ...
    def __le__(self, other: Any, /) -> bool: ...


T = TypeVar("T", bound=Instant)


class Times(Protocol[T]):
    """A schedule's due times (``longrun.cadence.Cadence``)."""

    def after(self, moment: T) -> T:
        """The first due time strictly after ``moment``."""

    def last_before(self, start: T, bound: T) -> T:
        """The last due time at or after ``start`` (a due time before ``bound``) and before ``bound``."""


@dataclass(frozen=True, slots=True)
class Missed(Generic[T]):
    """Due times not fired because they were older than the catch-up window: ``first`` to ``last``."""

    first: T
    last: T


@dataclass(frozen=True, slots=True)
class Firing(Generic[T]):
    """What a look at a schedule does: the due times to create runs for, the range missed, and the next
    due time to store."""

    due: tuple[T, ...]
    missed: Missed[T] | None
    next_due: T


def plan_firing(times: Times[T], next_due: T, now: T, window: T, per_round: int) -> Firing[T]:
    """The due times from ``next_due`` up to ``now``: those before ``window`` (now less the catch-up
    window) missed, the rest fired, at most ``per_round`` of them (the next look goes on from there)."""
    missed = None
    if next_due < window:
        last_missed = times.last_before(next_due, window)
        missed = Missed(next_due, last_missed)
        next_due = times.after(last_missed)
    due: list[T] = []
    while next_due <= now and len(due) < per_round:
        due.append(next_due)
        next_due = times.after(next_due)
    return Firing(tuple(due), missed, next_due)
