"""Which waits hold a tenant slot.

A slot is a tenant's share of the workers. A run that waits for something only the outside world or
the clock can end, and that will need a worker again the moment it ends (an event, a person, a retry's
back-off, a sleep), keeps its slot: giving it back would let a newer run take its place while it is
about to go on. A run that waits because *running it now is not worth it* gives its slot back in the
statement that parks it, handing it on to its tenant's next queued run exactly as a finished run does:

- ``tool_healthy``: the far side its next call needs has an open circuit breaker;
- ``rate_limit``: its next call's far side has no capacity left in the current period;
- ``tenant_budget``: its tenant spent its budget for the period;
- ``tool_concurrency``: its next call's tool group has as many calls of its tenant in flight as it may.

These waits end together for many runs (a breaker closes, a period rolls over), so holding their
slots would block every other run of the tenant for as long as the far side is down (with slots
four, four runs parked on a broken tool stop the tenant). When one of them ends, the run is
*queued*: ``READY`` and not admitted, admitted again by priority with aging like a new run, never
handed straight to a worker (the worker's take refuses a queued run, whoever woke it). Its age counts
from its creation, so a run that was parked goes before the runs created after it.

The same reasoning holds for a parent that waits for its children (``children``): its children need
the slots, or four parents at four slots deadlock.
"""

from __future__ import annotations

from longrun.domain.breaker import TOOL_HEALTHY_WAIT
from longrun.domain.children import CHILDREN_WAIT
from longrun.domain.run import RunStatus
from longrun.domain.snapshot import RunSnapshot
from longrun.domain.tenant_limits import TENANT_BUDGET_WAIT
from longrun.domain.tool_permits import TOOL_CONCURRENCY_WAIT

SLOTLESS_WAITS: frozenset[str] = frozenset({
    TOOL_HEALTHY_WAIT,
    "rate_limit",  # a call parked on its far side's rate limit
    TENANT_BUDGET_WAIT,
    TOOL_CONCURRENCY_WAIT,
    CHILDREN_WAIT,
})
"""The wait kinds a run gives its slot back for."""

QUEUED_STATUS = RunStatus.READY
"""The status of a run waiting for a slot (while not admitted)."""


def gives_slot_back(before: RunSnapshot, after: RunSnapshot) -> bool:
    """Whether the move from ``before`` to ``after`` parks the run in a wait that holds no slot (a
    new one: a later write to a run already parked gives nothing back again). One attribute test
    for a move that starts no wait, which is nearly every move."""
    wait = after.wait
    return (wait is not None and wait.kind in SLOTLESS_WAITS
            and (before.wait is None or before.wait.wait_id != wait.wait_id))


def queued(status: RunStatus, admitted: bool) -> bool:
    """A run waiting for a slot: ready for a worker but not admitted (created, or woken from a wait
    that held no slot). A worker never takes one; admission or a freed slot's handover admits it."""
    return not admitted and status is QUEUED_STATUS
