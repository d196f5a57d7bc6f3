"""Tool concurrency: how many calls of one tenant's tool group may be in flight at once.

Responsibility: decide which of a tenant's tool groups (``TenantLimits.tool_concurrency``) bounds a
tool's calls, and the wait of a call that finds its group's permits all held. Storage keeps one
permit per call in flight, naming the worker that holds it, and judges under the group's lock.

Invariants:
- A tool is bounded by the group named exactly as the tool, else by the longest prefix group
  (``forge.*``) its name starts with, else not at all: each call counts in one group only.
- At most ``bound`` permits of a tenant's group are live at once. A permit is live while its holder
  is a live member and still holds the run's lease: a dead worker's permits are free once its
  membership lapses, whatever its run leases say.
- A run that waits for a permit holds no tenant slot, and is woken once per permit freed.
"""

from __future__ import annotations

from collections.abc import Mapping

from longrun.domain.snapshot import Wait

TOOL_CONCURRENCY_WAIT = "tool_concurrency"
"""The wait kind (reason) of a run whose call waits for a permit of its tool group."""
TOOL_CONCURRENCY_PREFIX = "tool_concurrency:"
"""A waiting run shows ``waiting_for: tool_concurrency:<group>``; its wait's correlation key is that."""
PREFIX_WILDCARD = "*"


def bounded_group(tool: str, bounds: Mapping[str, int]) -> tuple[str, int] | None:
    """The group of the tenant's ``bounds`` that bounds ``tool``'s calls, and its bound; None: none does."""
    if tool in bounds:
        return tool, bounds[tool]
    prefixes = [group for group in bounds
                if group.endswith(PREFIX_WILDCARD) and tool.startswith(group[:-len(PREFIX_WILDCARD)])]
    if not prefixes:
        return None
    group = max(prefixes, key=len)
    return group, bounds[group]


def waiting_key(group: str) -> str:
    """The correlation key of the runs waiting for ``group``'s permits (one tenant's: read with it)."""
    return f"{TOOL_CONCURRENCY_PREFIX}{group}"


def permit_wait(*, wait_id: str, group: str, logical_action: str, now: float, max_wait: float) -> Wait:
    """The wait of a call whose group's permits are all held: woken by the key when a permit is freed
    (one waiter per permit), and by its own timer after ``max_wait`` seconds at the latest."""
    return Wait(wait_id=wait_id, kind=TOOL_CONCURRENCY_WAIT, deadline=now + max_wait, wake_at=now + max_wait,
                correlation_key=waiting_key(group), subject=logical_action)
