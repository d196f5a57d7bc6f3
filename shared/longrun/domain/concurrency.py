"""Concurrency keys: at most ``limit`` runs of one tenant hold a key at once (``"repo:acme/api"``: one
upgrade per repository). A run takes its key at its first admission and holds it until it ends,
also while it waits having given its tenant slot back. What a create does when the key is taken is
its kind's policy, decided here from the key's open runs; admission (``db.admission``) keeps the
bound for the runs that queue.

Schedule overlap policies are these keys with a limit of one: skip is ``REFUSE``, buffer one is
``QUEUE`` with ``max_waiting=1``, cancel previous is ``CANCEL_IN_PROGRESS``, allow is no key.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

KEY_CHARS = 200
"""Characters a key may have (it is stored and indexed with every run that has one)."""
LARGEST_LIMIT = 32_767
"""A key's limit is stored as a smallint."""


class KeyPolicy(enum.StrEnum):
    """What a create does when its key's runs already fill the limit."""

    QUEUE = "queue"
    """The new run waits, holding no tenant slot, until a holder ends (bounded by ``max_waiting``)."""
    CANCEL_IN_PROGRESS = "cancel_in_progress"
    """The key's earlier runs are asked to cancel (the cancel protocol); the new run waits for the key."""
    REFUSE = "refuse"
    """The new run is refused (``run.rejected``, code ``concurrency_key_held``); nothing is created."""


@dataclass(frozen=True, slots=True)
class KeyClaim:
    """The key a run asks for, within its tenant, and how many runs may hold it at once."""

    key: str
    limit: int


@dataclass(frozen=True, slots=True)
class KeyedRun:
    """An unfinished run with the key, as a create reads them (oldest first)."""

    run_id: str
    holding: bool
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class Refuse:
    reason: str


@dataclass(frozen=True, slots=True)
class Queue:
    """The new run is created and waits for its key; ``cancel``: the runs asked to cancel first."""

    cancel: tuple[str, ...] = ()


def key_problem(key: object) -> str | None:
    """Why ``key`` (what a kind derived from an input) is not a key; None when it is one."""
    if not isinstance(key, str):
        return f"a concurrency key is a string, got {type(key).__name__}"
    if not 0 < len(key) <= KEY_CHARS:
        return f"a concurrency key has 1 to {KEY_CHARS} characters, got {len(key)}"
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        return "a concurrency key has no control characters"
    return None


def reads_open_runs(policy: KeyPolicy, max_waiting: int | None) -> bool:
    """Whether a create must read its key's open runs: only a policy that refuses or cancels does."""
    return policy is not KeyPolicy.QUEUE or max_waiting is not None


def on_create(policy: KeyPolicy, claim: KeyClaim, max_waiting: int | None,
              open_runs: Sequence[KeyedRun]) -> Refuse | Queue:
    """What a create of a run claiming ``claim`` does, given the key's unfinished runs (oldest first)."""
    if policy is KeyPolicy.CANCEL_IN_PROGRESS:
        # The newest runs win: the new one and the limit-1 newest before it keep their place.
        earlier = open_runs[:max(0, len(open_runs) - (claim.limit - 1))]
        return Queue(tuple(r.run_id for r in earlier if not r.cancel_requested))
    depth = 0 if policy is KeyPolicy.REFUSE else max_waiting
    if depth is not None and len(open_runs) >= claim.limit + depth:
        holding = [r.run_id for r in open_runs if r.holding]
        waiting = len(open_runs) - len(holding)
        held = f"held by {', '.join(holding)}" if holding else "taken"
        return Refuse(f"concurrency key {claim.key!r} is {held} (limit {claim.limit}"
                      + (f", {waiting} waiting, at most {depth} may wait)" if policy is KeyPolicy.QUEUE else ")"))
    return Queue()
