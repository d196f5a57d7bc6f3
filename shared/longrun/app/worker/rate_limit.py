"""A call to a rate-limited far side takes its place in line first (``domain.rate_limit``).

A call whose buckets have room goes at once. One that must wait gets a reservation for the time
the buckets allow and parks its run, uncharged, on a durable timer for that time, showing
``waiting_for: rate_limit:<name>``; the reservation is on record as the fact
``rate_limit:<logical action>`` (with the attempt it is for), so the call made when the timer
wakes the run goes without asking the buckets again: one extra wake per limited call, whichever
worker takes the run. The timer is set ``FarSide.rate_limit_lead`` seconds ahead of the place and
the worker waits out the rest, so a wake that comes late by less than that still calls on time
(the far side sees the calls as the buckets placed them). A far side that declares no limit costs
nothing here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from longrun import metrics
from longrun.app.worker.commit import Step
from longrun.app.worker.far_side import FarSide
from longrun.domain import RunStatus, freeze
from longrun.domain import events as ev
from longrun.domain.rate_limit import RESERVATION_FACT_PREFIX, RateLimit, Unit, reservation_wait
from longrun.ports.runs import StoredRun


@dataclass(frozen=True, slots=True)
class Place:
    """A call's place in line, come: what it reserved, for what is given back after it."""

    tokens: int
    """Model tokens reserved (0 for a call limited in requests only)."""


async def in_line(far: FarSide, step: Step, stored: StoredRun, limits: Sequence[RateLimit], logical_action: str,
                  attempt: int, *, tokens: int = 0) -> Place | None:
    """The call's place when it may go now; None when its run was parked for its place (the caller
    returns). ``attempt`` tells this attempt's reservation from an earlier one's."""
    if not limits or far.rate_limits is None:
        return Place(0)
    run = stored.snapshot
    fact_key = RESERVATION_FACT_PREFIX + logical_action
    ctx = far.context()
    held = _held(run.fact(fact_key), attempt)
    if held is not None:
        go_at = float(held["go_at"])  # type: ignore[arg-type]
        if ctx.now >= go_at - far.rate_limit_lead:
            # Woken ahead of its place by the lead its wake may be late by: the rest waited out here.
            await asyncio.sleep(max(0.0, go_at - ctx.now))
            return Place(int(held["tokens"]))  # type: ignore[call-overload]
        # Woken before its time (an operator's wake): the same place, waited for again.
        await _park(far, step, stored, logical_action, str(held["limit"]), go_at, events=[])
        return None
    charges = [(limit, limit.bucket(run.tenant_id), float(tokens if limit.unit is Unit.TOKENS else 1))
               for limit in limits]
    wait, binding = await far.rate_limits.reserve(charges)
    if wait <= 0:
        return Place(tokens)
    metrics.RATE_LIMITED.labels(binding).inc()
    metrics.RATE_LIMIT_WAIT.labels(binding).observe(wait)
    if wait <= far.rate_limit_lead:
        # Its place is nearer than a wake would take: waited for here, with no wake at all.
        await asyncio.sleep(wait)
        return Place(tokens)
    # From the clock read once the buckets answered: never ahead of the place they gave.
    go_at = far.clock() + wait
    fact = step.event(stored, ev.FactRecorded, key=fact_key, source="runtime", value=freeze(
        {"limit": binding, "attempt": attempt, "go_at": go_at, "tokens": tokens}))
    await _park(far, step, stored, logical_action, binding, go_at, events=[fact])
    return None


def _held(fact: object, attempt: int) -> Mapping[str, object] | None:
    """The reservation a fact holds for ``attempt``; None for none (or an earlier attempt's)."""
    value = getattr(fact, "value", None)
    if isinstance(value, Mapping) and value.get("attempt") == attempt:
        return value
    return None


async def _park(far: FarSide, step: Step, stored: StoredRun, logical_action: str, limit: str, go_at: float,
                *, events: list[ev.RunEvent]) -> None:
    ctx = far.context()
    wait = reservation_wait(wait_id=ctx.new_id(), limit_name=limit, logical_action=logical_action,
                            wake_at=go_at - far.rate_limit_lead)
    started = step.event(stored, ev.WaitStarted, offset=len(events) + 1, status=RunStatus.RETRY_SCHEDULED,
                         wait=wait)
    await step.commit(stored, [*events, started], release=True)
