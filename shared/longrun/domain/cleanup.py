"""Cleanup at closure: what a finished run's declared cleanup steps do next, decided from states. Pure.

Responsibility (seed 004 section 8: closing releases the workspace and lease, revokes temporary
credentials; a cleanup failure never turns a completed result into a failure, it is its own
cleanup alert and is retried):
- ``starts``: which finishing moves owe a cleanup. Every terminal status but TERMINATED does
  (terminate is immediate and skips cleanup on purpose).
- ``logical_action`` and ``key``: each step is one action on the ledger, under a key of its own that
  every attempt reuses, so a step that took effect is never repeated and one cut short is found.
- ``look_first``: whether an earlier attempt of a step may have acted, so the far side is asked by
  key before the step is sent again (a non-idempotent write, never sent blind twice).
- ``retry_in``: the backoff before the next attempt. Cleanup is never given up: past the policy's
  attempts it keeps its longest delay, and its alert stays open until a step succeeds.
- ``hold``: how long a claimed cleanup is left to the one claiming it, after which another
  reconciler takes it over (its claimant died).

Invariants:
- A cleanup records facts on the finished run (``run.cleanup`` events) and never changes its status.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from longrun.domain.action import ActionStatus, EffectKind, idempotency_key
from longrun.domain.closure import finishes
from longrun.domain.retry import RetryPolicy, Rng, next_delay
from longrun.domain.run import TERMINAL, RunStatus
from longrun.domain.snapshot import RunSnapshot

CLEANS_UP = TERMINAL - {RunStatus.TERMINATED}
"""The ends after which a run's cleanup steps run."""

PREFIX = "cleanup:"
"""Every cleanup step's logical action starts so; the run's own decisions never use it."""

DONE = "done"
FAILED = "failed"
"""A ``run.cleanup`` event's outcomes."""

HOLD_MARGIN = 10.0
"""Seconds a claim is held beyond its steps' own time limits."""


def starts(before: RunSnapshot, after: RunSnapshot) -> bool:
    """Whether the move from ``before`` to ``after`` finishes the run in a way that owes a cleanup."""
    return finishes(before, after) and after.status in CLEANS_UP


def logical_action(step: str) -> str:
    return PREFIX + step


def is_cleanup(logical: str) -> bool:
    return logical.startswith(PREFIX)


def key(run_id: str, step: str) -> str:
    """The idempotency key of every attempt of ``step`` of ``run_id``'s cleanup."""
    return idempotency_key(run_id, logical_action(step), attempt_scope="cleanup")


def look_first(effect: EffectKind, earlier: ActionStatus | None) -> bool:
    """Whether the far side is asked by key before a step is sent: a non-idempotent write that an
    earlier attempt (``earlier``, its ledger status; None: none) may have carried out."""
    return effect is EffectKind.NON_IDEMPOTENT_WRITE and earlier is not None and earlier is not ActionStatus.CONFIRMED


def retry_in(policy: RetryPolicy, attempt: int, *, rng: Rng) -> float:
    """Seconds before the attempt after ``attempt`` (1-based) failed."""
    capped = min(attempt, max(1, policy.maximum_attempts - 1))
    delay = next_delay(replace(policy, maximum_attempts=capped + 1), capped, rng=rng)
    assert delay is not None, "a policy allowing one more attempt has a delay"
    return delay


def hold(time_limits: Iterable[float]) -> float:
    """Seconds a claim keeps a cleanup whose steps' calls may take ``time_limits`` (each looked up
    and sent at worst)."""
    return 2 * sum(time_limits) + HOLD_MARGIN
