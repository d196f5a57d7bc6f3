"""Resume context: what the model is shown when a run continues, built from structured state.

Responsibility: derive the model's view of a run (goal, permissions, stage, confirmed
facts, actions with receipts, open questions, allowed next steps, remaining budget) from
the snapshot only, never from chat memory, and shrink it when it grows too long.

Invariants:
- The context is a pure function of the snapshot; nothing the model said earlier leaks in.
- ``compact`` never drops or changes the goal, the permissions, pending (unsettled)
  actions, open questions, approval decisions or people's answers. It may drop the oldest facts first,
  then the oldest settled receipts, and says how many items it left out.
- Allowed next steps are empty when the model must not be asked at all: the run is
  finished or being cancelled. While an action awaits reconciliation, only reconciling it
  is allowed; kinds of work without remaining budget are not offered.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from longrun.domain.action import SETTLED, UNRECONCILED, ActionRecord, ActionStatus
from longrun.domain.budget import Usage, remaining
from longrun.domain.codec import FrozenMap
from longrun.domain.run import TERMINAL, RunStatus
from longrun.domain.scope import Scope
from longrun.domain.snapshot import (
    ANSWER_FACT_PREFIX,
    APPROVAL_FACT_PREFIX,
    SIGNAL_FACT_PREFIX,
    Fact,
    Question,
    RunSnapshot,
)


@dataclass(frozen=True, slots=True)
class ResumeContext:
    """The model's whole view of a run at resume; serialisable with ``to_plain``."""

    run_id: str
    goal: FrozenMap
    permissions: Scope | None
    stage: str
    status: RunStatus
    facts: tuple[Fact, ...]
    actions: tuple[ActionRecord, ...]
    open_questions: tuple[Question, ...]
    allowed_next_steps: tuple[str, ...]
    remaining: Usage
    omitted: int = 0
    """Facts and settled receipts left out by compaction; the model is told they exist."""


def allowed_next_steps(snapshot: RunSnapshot) -> tuple[str, ...]:
    """Decision names the runtime would accept now; empty means do not ask the model."""
    if snapshot.status in TERMINAL or snapshot.cancel_requested:
        return ()
    unreconciled = [a.logical_action for a in snapshot.actions if a.status in UNRECONCILED]
    if unreconciled:
        return tuple(f"reconcile:{name}" for name in unreconciled)
    left = remaining(snapshot.budget)
    steps: list[str] = []
    if left.tool_calls > 0 and left.cost > 0:
        steps.append("call_tool")
        retryable = (a.logical_action for a in snapshot.actions if a.status is ActionStatus.RETRYABLE)
        steps.extend(f"retry:{name}" for name in retryable)
    if left.model_calls > 0 and left.cost > 0:
        steps.append("ask_model")
    steps.extend(("wait_for_event", "wait_for_user", "complete", "fail"))
    return tuple(steps)


def build_resume_context(snapshot: RunSnapshot) -> ResumeContext:
    """The full, uncompacted context for ``snapshot``."""
    return ResumeContext(
        run_id=snapshot.run_id,
        goal=snapshot.goal,
        permissions=snapshot.permissions,
        stage=snapshot.stage,
        status=snapshot.status,
        facts=snapshot.facts,
        actions=snapshot.actions,
        open_questions=snapshot.open_questions,
        allowed_next_steps=allowed_next_steps(snapshot),
        remaining=remaining(snapshot.budget),
    )


KEPT_FACT_PREFIXES = (APPROVAL_FACT_PREFIX, ANSWER_FACT_PREFIX, SIGNAL_FACT_PREFIX)
"""What people decided and answered, and the signals sent to the run: compaction never drops those facts."""


def compact(ctx: ResumeContext, max_items: int) -> ResumeContext:
    """Keep at most ``max_items`` droppable items (plain facts, settled receipts), newest first.

    Facts go before receipts: a receipt is the ledger's word on an external effect.
    """
    if max_items < 0:
        raise ValueError(f"max_items must be >= 0, got {max_items}")
    plain_facts = [f for f in ctx.facts if not f.key.startswith(KEPT_FACT_PREFIXES)]
    receipts = [a for a in ctx.actions if a.status in SETTLED]
    excess = max(0, len(plain_facts) + len(receipts) - max_items)
    dropped_facts = {f.key for f in plain_facts[:excess]}
    dropped_receipts = {a.logical_action for a in receipts[: max(0, excess - len(plain_facts))]}
    return replace(
        ctx,
        facts=tuple(f for f in ctx.facts if f.key not in dropped_facts),
        actions=tuple(a for a in ctx.actions if a.logical_action not in dropped_receipts),
        omitted=ctx.omitted + excess,
    )
