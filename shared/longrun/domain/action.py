"""Side-effect actions: their own state machine, effect kinds, and request identity.

Responsibility: the ledger's rules for one logical action (one business intent with
one idempotency key), independent of the run that issued it. A run may hold a
confirmed CI trigger, a pull request under reconciliation and a compensated temporary
environment at once.

Invariants:
- ``ACTION_TRANSITIONS`` is the only source of legal moves. A timeout is UNKNOWN, never
  FAILED: FAILED means the far side definitely rejected the request.
- After a crash, pure and idempotent work re-runs, reads re-run and record the version
  they read, and non-idempotent writes go to reconciliation, never blind retry.
- One idempotency key belongs to one logical action and one request hash; a retry with
  different arguments would be a different operation and must get a different key.
- A new attempt after a definite failure is a new logical action (its own key and
  ledger row), not a second life of the failed one — unless an operator retries it
  (FAILED -> RETRYABLE): a person judged the cause fixed, and the same key lets the
  far side dedup.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from longrun.domain.codec import thaw
from longrun.errors import IllegalTransition


class ActionStatus(str, Enum):
    PREPARED = "PREPARED"
    SUBMITTED = "SUBMITTED"
    CONFIRMED = "CONFIRMED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"
    RECONCILING = "RECONCILING"
    RETRYABLE = "RETRYABLE"
    NEEDS_ATTENTION = "NEEDS_ATTENTION"
    COMPENSATING = "COMPENSATING"
    COMPENSATED = "COMPENSATED"


_A = ActionStatus

ACTION_TRANSITIONS: Mapping[ActionStatus, frozenset[ActionStatus]] = MappingProxyType(
    {
        _A.PREPARED: frozenset({_A.SUBMITTED}),
        # SUBMITTED -> RETRYABLE: the far side answered that it did not act (unavailable).
        _A.SUBMITTED: frozenset({_A.CONFIRMED, _A.FAILED, _A.UNKNOWN, _A.RETRYABLE}),
        _A.UNKNOWN: frozenset({_A.RECONCILING}),
        # RECONCILING -> UNKNOWN: the far side could not tell yet; try again later.
        _A.RECONCILING: frozenset({_A.CONFIRMED, _A.RETRYABLE, _A.NEEDS_ATTENTION, _A.UNKNOWN}),
        # RETRYABLE means nothing happened (reconciliation proved it, or the far side said it was
    # unavailable): resubmitting the same key is safe.
        _A.RETRYABLE: frozenset({_A.SUBMITTED}),
        _A.NEEDS_ATTENTION: frozenset({_A.CONFIRMED, _A.RETRYABLE}),
        _A.CONFIRMED: frozenset({_A.COMPENSATING}),
        _A.COMPENSATING: frozenset({_A.COMPENSATED}),
        # FAILED -> RETRYABLE: only by an operator's retry of the action (``operate.retry_action``).
        _A.FAILED: frozenset({_A.RETRYABLE}),
        _A.COMPENSATED: frozenset(),
    }
)

SETTLED: frozenset[ActionStatus] = frozenset({_A.CONFIRMED, _A.FAILED, _A.COMPENSATED})
"""Outcomes the far side has definitely reported; every other status is pending."""

IN_DOUBT: frozenset[ActionStatus] = frozenset(
    {_A.SUBMITTED, _A.UNKNOWN, _A.RECONCILING, _A.NEEDS_ATTENTION, _A.COMPENSATING}
)
"""The far side may be acting, or may have acted, and no definite outcome is recorded."""

UNRECONCILED: frozenset[ActionStatus] = frozenset({_A.UNKNOWN, _A.RECONCILING, _A.NEEDS_ATTENTION})
"""Outcomes only reconciliation or an operator can settle; they hold a run in ACTION_UNKNOWN."""

AWAITING_RECONCILER: frozenset[ActionStatus] = frozenset({_A.UNKNOWN, _A.RECONCILING})
"""Outcomes the reconciler has yet to settle (the oldest of them is what an operator watches)."""


def check_action_transition(from_: ActionStatus, to: ActionStatus) -> None:
    """Raise ``IllegalTransition("action", from_, to)`` unless the table allows the move."""
    if to not in ACTION_TRANSITIONS[from_]:
        raise IllegalTransition("action", from_.value, to.value)


class EffectKind(str, Enum):
    PURE = "pure"
    READ = "read"
    IDEMPOTENT_WRITE = "idempotent_write"
    NON_IDEMPOTENT_WRITE = "non_idempotent_write"


class RecoveryPolicy(str, Enum):
    RERUN = "rerun"
    RERUN_AND_RECORD_VERSION = "rerun_and_record_version"
    RECONCILE = "reconcile"


_RECOVERY: Mapping[EffectKind, RecoveryPolicy] = MappingProxyType(
    {
        EffectKind.PURE: RecoveryPolicy.RERUN,
        EffectKind.IDEMPOTENT_WRITE: RecoveryPolicy.RERUN,
        # Re-reading may see newer data; the version read is recorded so old decisions stay explainable.
        EffectKind.READ: RecoveryPolicy.RERUN_AND_RECORD_VERSION,
        EffectKind.NON_IDEMPOTENT_WRITE: RecoveryPolicy.RECONCILE,
    }
)


def recovery_policy(effect_kind: EffectKind) -> RecoveryPolicy:
    """What a worker may do with an interrupted step of this effect kind."""
    return _RECOVERY[effect_kind]


def request_hash(tool: str, version: str, *, args: Mapping[str, object]) -> str:
    """SHA-256 of the canonical JSON of (tool, version, args), as lowercase hex.

    Canonical means sorted keys and no whitespace, so equal requests hash equally
    regardless of key order. Used to refuse an idempotency key reused with other args
    and to bind an approval to the exact request it approves.
    """
    canonical = json.dumps(
        {"tool": tool, "version": version, "args": thaw(args)},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def idempotency_key(run_id: str, logical_action: str, *, attempt_scope: str | int) -> str:
    """Deterministic key for one business intent, bound to the action, not to a model call.

    Opaque and fixed-length ("lr-" + 40 hex digits) so it fits providers that cap key
    length, and unambiguous however the parts contain separators. ``attempt_scope``
    is compared as text: 1 and "1" are the same scope.
    """
    parts = json.dumps([run_id, logical_action, str(attempt_scope)], ensure_ascii=False)
    return "lr-" + hashlib.sha256(parts.encode("utf-8")).hexdigest()[:40]


@dataclass(frozen=True, slots=True)
class ActionRecord:
    """The run's summary of one logical action; the ledger row holds the full request and receipt."""

    logical_action: str
    tool: str
    tool_version: str
    effect_kind: EffectKind
    status: ActionStatus
    idempotency_key: str
    request_hash: str
    attempts: int = 0
    """Submissions so far, resubmissions after RETRYABLE included (feeds the retry policy)."""
    external_id: str | None = None
    receipt_ref: str | None = None
    detail: str | None = None
    """Last outcome detail: the rejection, the unknown cause, or the reconciler/operator note."""
    approval_id: str | None = None
    """The approval whose hash this request matched when it was prepared, if one was required."""
    compensation_ref: str | None = None
