"""A create's concurrency key (``authoring.ConcurrencyKey``): the key its kind derives from its input,
and its kind's policy applied when the key's runs fill the limit: refuse the new run, or ask the
earlier ones to cancel through the cancel protocol (the operators' ``cancel``: ``cancel_requested``
recorded, audited, broadcast, the run woken to end CANCELLED at its next safe point). Queued runs wait
for the key in admission (``db.admission``); a create whose policy only queues reads nothing here."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from longrun.app.gateway import operate
from longrun.authoring import RunKind
from longrun.domain.concurrency import KeyClaim, KeyPolicy, Queue, Refuse, on_create, reads_open_runs
from longrun.ports.stores import RunTransaction


def claim_of(kind: RunKind, value: Mapping[str, Any]) -> KeyClaim | None:
    """The key a run of ``kind`` with input ``value`` claims; ValueError saying why it has no valid one."""
    return None if kind.concurrency is None else kind.concurrency.claim(value)


def reads(kind: RunKind) -> bool:
    """Whether a create of ``kind`` with a key reads the key's runs (its policy refuses or cancels)."""
    declared = kind.concurrency
    return declared is not None and reads_open_runs(declared.policy, declared.max_waiting)


async def apply_policy(tx: RunTransaction, kind: RunKind, claim: KeyClaim, *, tenant_id: str, run_id: str,
                       clock: Callable[[], float] = time.time) -> str | None:
    """What ``kind``'s policy does for the new run ``run_id`` claiming ``claim``, under the tenant's
    admission lock (creates of one tenant read the key one after another): the reason it is refused,
    or None when it is created (the key's earlier runs asked to cancel first, if the policy says so)."""
    declared = kind.concurrency
    if declared is None or not reads(kind):
        return None
    # Refusing needs no more runs than the limit plus those allowed to wait; cancelling reads them all.
    up_to = (LARGEST_READ if declared.policy is KeyPolicy.CANCEL_IN_PROGRESS
             else claim.limit + (declared.max_waiting or 0))
    decided = on_create(declared.policy, claim, declared.max_waiting,
                        await tx.keyed_runs(tenant_id, claim, up_to=up_to))
    if isinstance(decided, Refuse):
        return decided.reason
    await _cancel(tx, decided, claim, run_id, clock)
    return None


LARGEST_READ = 1000
"""Earlier runs a cancelling create reads: more than a cancelling key ever has open (each create
cancels the ones before it)."""


async def _cancel(tx: RunTransaction, decided: Queue, claim: KeyClaim, run_id: str,
                  clock: Callable[[], float]) -> None:
    for earlier in decided.cancel:
        try:
            await operate.cancel(tx, earlier, actor=f"concurrency_key:{claim.key}",
                                 reason=f"run {run_id} took concurrency key {claim.key!r} (cancel in progress)",
                                 clock=clock)
        except operate.NotPending:  # it ended, or is ending, since it was read
            continue
