"""A call to a rate-limited far side takes its place in line first (``domain.rate_limit``).

A call whose buckets have room goes at once. One that must wait gets a reservation for the time
the buckets allow and parks its run, uncharged, on a durable timer for that time, showing
``waiting_for: rate_limit:<name>``; the reservation is on record as the fact
``rate_limit:<logical action>`` (with the attempt it is for), so the call made when the timer
wakes the run goes without asking the buckets again: one extra wake per limited call, whichever
worker takes the run. The timer is set ``FarSide.rate_limit_lead`` seconds ahead of the place and
the worker waits out the rest, so a wake that comes late by less than that still calls on time
(the far side sees the calls as the buckets placed them); a wake later than that (an outage) finds
its place gone and takes a new one. A far side that declares no limit costs nothing here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from longrun import metrics
from longrun.app.worker.commit import Step
from longrun.app.worker.far_side import FarSide
from longrun.domain import RunStatus, freeze
from longrun.domain import events as ev
from longrun.domain.rate_limit import RESERVATION_FACT_PREFIX, RateLimit, Unit, reservation_wait
from longrun.model import ModelRateLimited, Proposal, input_tokens_bound
from longrun.ports.runs import StoredRun


LATE_AFTER = 0.1
"""Seconds past its place a call may still go on it; a later one takes a new place."""
PARKED_CONTEXT_TOKENS = 256
"""What parking a model call for its place adds to the context it is asked with, at most: the
reservation's fact (its key and four short fields), reserved with the call's input."""


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
    # A place that passed while nobody could take it (the timer's wake came late: a database or
    # broker outage) is lost, not used late: calls kept out by an outage must not go all at once.
    if held is not None and ctx.now <= float(held["go_at"]) + LATE_AFTER:  # type: ignore[arg-type]
        go_at = float(held["go_at"])  # type: ignore[arg-type]
        if ctx.now >= go_at - far.rate_limit_lead:
            # Woken ahead of its place by the lead its wake may be late by: the rest waited out here.
            await asyncio.sleep(max(0.0, go_at - ctx.now))
            return await _unless_held(far, step, stored, limits, logical_action, dict(held))
        # Woken before its time (an operator's wake): the same place, waited for again.
        await _park(far, step, stored, logical_action, dict(held))
        return None
    charges = [(limit, limit.bucket(run.tenant_id), float(tokens if limit.unit is Unit.TOKENS else 1))
               for limit in limits]
    try:
        wait, binding = await far.rate_limits.reserve(charges)
    except ValueError as e:  # a call bigger than a bucket: no place in line would ever come
        await step.finish(stored, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION, reason=f"{logical_action}: {e}")
        return None
    if wait <= 0:
        return Place(tokens)
    metrics.RATE_LIMITED.labels(binding).inc()
    metrics.RATE_LIMIT_WAIT.labels(binding).observe(wait)
    # From the clock read once the buckets answered: never ahead of the place they gave.
    place = {"limit": binding, "attempt": attempt, "go_at": far.clock() + wait, "tokens": tokens}
    if wait <= far.rate_limit_lead:
        # Its place is nearer than a wake would take: waited for here, with no wake at all.
        await asyncio.sleep(wait)
        return await _unless_held(far, step, stored, limits, logical_action, place)
    await _park(far, step, stored, logical_action, place)
    return None


async def _unless_held(far: FarSide, step: Step, stored: StoredRun, limits: Sequence[RateLimit], logical_action: str,
                       place: dict[str, Any]) -> Place | None:
    """The call goes at its place, unless the far side said "not yet" (a 429) since it was given:
    then it waits for that, on the same place (None: parked)."""
    assert far.rate_limits is not None
    hold = await far.rate_limits.held([limit.bucket(stored.snapshot.tenant_id) for limit in limits])
    if hold > far.rate_limit_lead:
        await _park(far, step, stored, logical_action, {**place, "go_at": far.clock() + hold})
        return None
    await asyncio.sleep(hold)
    return Place(int(place["tokens"]))


def _held(fact: object, attempt: int) -> Mapping[str, object] | None:
    """The reservation a fact holds for ``attempt``; None for none (or an earlier attempt's)."""
    value = getattr(fact, "value", None)
    if isinstance(value, Mapping) and value.get("attempt") == attempt:
        return value
    return None


async def _park(far: FarSide, step: Step, stored: StoredRun, logical_action: str, place: dict[str, Any]) -> None:
    """The run parked until its place (the fact holds it; written again only when it changed)."""
    ctx = far.context()
    fact_key = RESERVATION_FACT_PREFIX + logical_action
    events: list[ev.RunEvent] = []
    known = stored.snapshot.fact(fact_key)
    if known is None or dict(known.value) != place:  # type: ignore[call-overload]
        events.append(step.event(stored, ev.FactRecorded, key=fact_key, source="runtime", value=freeze(place)))
    wait = reservation_wait(wait_id=ctx.new_id(), limit_name=str(place["limit"]), logical_action=logical_action,
                            wake_at=float(place["go_at"]) - far.rate_limit_lead)
    started = step.event(stored, ev.WaitStarted, offset=len(events) + 1, status=RunStatus.RETRY_SCHEDULED,
                         wait=wait)
    await step.commit(stored, [*events, started], release=True)


async def ask_model(far: FarSide, step: Step, stored: StoredRun, purpose: str, context: Mapping[str, Any],
                    allowed: Sequence[str], propose: Callable[[], Awaitable[Proposal | None]]) -> Proposal | None:
    """The model's answer, asked once its place in the model's limits came (None: the run was parked,
    for its place or by ``propose``). A token limit reserves the call's input plus ``max_tokens`` and gets back what the answer
    did not use; a 429 holds the model's buckets for as long as the server asked."""
    limits = far.model_limits
    if not limits or far.rate_limits is None:
        return await propose()
    run = stored.snapshot
    counted = [limit for limit in limits if limit.unit is Unit.TOKENS]
    tokens = input_tokens_bound(context, allowed) + far.model_max_tokens + PARKED_CONTEXT_TOKENS if counted else 0
    # Every attempt at the model is charged a model call: the count tells this attempt from the last.
    place = await in_line(far, step, stored, limits, f"model:{purpose}", run.budget.used.model_calls, tokens=tokens)
    if place is None:
        return None
    try:
        answer = await propose()
    except ModelRateLimited as e:
        if e.retry_after:
            for limit in limits:
                await far.rate_limits.not_before(limit, limit.bucket(run.tenant_id), e.retry_after)
        raise
    if answer is None:
        return None
    unused = place.tokens - answer.usage.input_tokens - answer.usage.output_tokens
    for limit in counted:
        await far.rate_limits.refund(limit, limit.bucket(run.tenant_id), unused)
    return answer
