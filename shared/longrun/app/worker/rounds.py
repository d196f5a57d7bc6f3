"""One round of a run's turn: the checks that need nothing but the run (finished or parked, moved to a
version this worker lacks, cancelling, an action in doubt, budget), then the workflow's pure
``decide``, and the decision carried out. What needs no call out is written with the round after
it (``defer``): a READY run's move to RUNNING with its first step, the patches a decision took
with what it writes next."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from longrun.app import questions
from longrun.app.worker import stragglers
from longrun.app.worker.cancelling import cancel
from longrun.app.worker.children import start_children, wait_for_children
from longrun.app.worker.claim_checks import resolved
from longrun.app.worker.commit import Step
from longrun.app.worker.fan_out import fan_out
from longrun.app.worker.far_side import FarSide
from longrun.app.worker.worth_running import parked_before_deciding
from longrun.app.worker.model_call import ask_model
from longrun.app.worker.step_failure import step_failed
from longrun.app.worker.tool_call import call_tool
from longrun.authoring import Registry, pins_key
from longrun.domain import (
    ANSWER_FACT_PREFIX,
    WORKER_HAS_WORK,
    AskModel,
    AskUser,
    CallTool,
    CallTools,
    Complete,
    DecisionContext,
    Fail,
    Reconcile,
    RunStatus,
    ScheduleRetry,
    StartChildren,
    WaitForChildren,
    WaitForEvent,
    WaitForSignal,
    WaitForUser,
    budget_needs,
    exhausted,
    wait_for,
)
from longrun.domain import approval_validity, joins
from longrun.domain import events as ev
from longrun.ports.runs import StoredRun, defer

logger = logging.getLogger("longrun.app.worker")


async def play(far: FarSide, step: Step, stored: StoredRun, kinds: Registry,
               served: frozenset[str]) -> StoredRun | None:
    """One decision; the state to continue from, or None once the run left this worker."""
    run = stored.snapshot
    if run.status not in WORKER_HAS_WORK:  # finished or parked meanwhile
        await step.commit(stored, [], release=True)
        return None
    if pins_key(run.kind, run.versions) not in served:
        # Migrated since it was taken, to a version this worker lacks: a worker that runs it takes it.
        logger.warning("run %s: %s@%s is not run here; handed over", run.run_id, run.kind, run.versions.workflow)
        await step.landed()
        await step.store.hand_over(run.run_id, step.fence)
        return None
    if run.status is RunStatus.READY:
        # Written with the round's own transition: one statement (and snapshot written) per run less.
        stored = defer(stored, [step.event(stored, ev.RunStatusChanged, to=RunStatus.RUNNING,
                                           reason=f"taken by {step.fence.owner}")])
        run = stored.snapshot
    if run.status is RunStatus.CANCELLING:
        return await cancel(step, stored, kinds)
    if await _parked_in_doubt(step, stored, joins.holding(run)):
        return None
    kind = kinds.get(run.kind, run.versions.workflow)
    settled = await stragglers.send_again(far, step, stored, kind)
    if settled is None:
        return None
    stored = settled
    if await parked_before_deciding(far, step, stored, kind):
        return None
    ctx = far.context()
    stored = _with_expired_approvals(step, stored, ctx.now)
    run = await resolved(far.artifacts, stored.snapshot)  # the kind reads large proposals as it reads small ones
    try:
        decision = kind.workflow.decide(run, ctx)
    except Exception as e:
        await step_failed(far, step, stored, kind, "decide", e)
        return None
    spent = exhausted(run.budget, budget_needs(decision, run))
    if spent is not None:
        await step.finish(stored, ev.RunStatusChanged, to=RunStatus.BUDGET_EXHAUSTED, reason=f"budget {spent} exhausted")
        return None
    if isinstance(decision, (CallTool, CallTools, Complete)) and await _parked_in_doubt(
            step, stored, joins.holding(run, settling=True)):
        return None  # a loser of a join still in doubt: no new effect, and no completion, before it settles
    if isinstance(decision, (AskModel, CallTool, CallTools)) and stored.unwritten_request is not None:
        # The step before is on record before anything more is asked of the world.
        stored = await step.commit(stored, [])
    decided_on, stored = stored, _with_patches(step, stored, ctx.taken)
    if isinstance(decision, AskModel):
        return await ask_model(far, step, stored, kind, decision)
    if isinstance(decision, CallTool):
        return await call_tool(far, step, stored, kind, decision)
    if isinstance(decision, StartChildren):
        return await start_children(step, stored, decision)
    if isinstance(decision, WaitForChildren):
        await wait_for_children(step, stored, decision, ctx)
        return None
    if isinstance(decision, CallTools):
        return await fan_out(far, step, stored, kind, decision)
    if isinstance(decision, (WaitForEvent, WaitForUser, WaitForSignal, ScheduleRetry)):
        status, wait = wait_for(decision, ctx)
        await step.finish(stored, ev.WaitStarted, status=status, wait=wait)
    elif isinstance(decision, AskUser):
        await _ask_user(step, stored, decision, ctx)
    elif isinstance(decision, Complete):
        try:
            unmet = kind.workflow.accept(run, decision.evidence)
        except Exception as e:
            # Recorded on the run as the step found it: a decision it could not carry out takes no patch.
            await step_failed(far, step, decided_on, kind, "accept", e)
            return None
        if unmet:
            await step.finish(stored, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION,
                              reason="acceptance check failed: " + "; ".join(unmet))
        else:
            step.crash_point("worker.before_completion")
            await step.finish(stored, ev.RunCompleted, evidence=decision.evidence)
    elif isinstance(decision, Fail):
        await step.finish(stored, ev.RunStatusChanged, to=RunStatus.FAILED, reason=decision.reason)
    else:
        assert isinstance(decision, Reconcile)
        await step.finish(stored, ev.RunStatusChanged, to=RunStatus.ACTION_UNKNOWN,
                          reason=f"{decision.logical_action} needs reconciliation")
    return None


async def _parked_in_doubt(step: Step, stored: StoredRun, doubtful: Sequence[str]) -> bool:
    """What to do next depends on whether those effects happened (e.g. an outcome recorded while the
    run was paused): parked until the reconciler settles them and wakes the run."""
    if not doubtful:
        return False
    await step.finish(stored, ev.RunStatusChanged, to=RunStatus.ACTION_UNKNOWN,
                      reason=f"{', '.join(doubtful)} awaits reconciliation")
    return True


async def _ask_user(step: Step, stored: StoredRun, decision: AskUser, ctx: DecisionContext) -> None:
    """The question and the wait for its answer, in one commit; a question that cannot be asked
    (its schema is not one, or its id was answered before) goes to a person instead."""
    name = decision.question_id
    problem = questions.schema_problem(decision.answer_schema)
    if problem is not None:
        reason = f"question {name!r}: its answer schema is not a JSON Schema (draft 2020-12): {problem}"
    elif stored.snapshot.fact(ANSWER_FACT_PREFIX + name) is not None:
        reason = f"decide asked question {name!r} again, answered already"
    else:
        status, wait = wait_for(decision, ctx)
        await step.commit(stored, [
            step.event(stored, ev.QuestionOpened, question_id=name, text=decision.text,
                       answer_schema=decision.answer_schema),
            step.event(stored, ev.WaitStarted, offset=2, status=status, wait=wait)], release=True)
        return
    await step.finish(stored, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION, reason=reason)


def _with_expired_approvals(step: Step, stored: StoredRun, now: float) -> StoredRun:
    """The run as ``decide`` reads it on resuming: a decision older than its approval's validity, that no
    call has used, is withdrawn (``run.approval_expired``, deferred: written with what the decision writes
    next), so ``decide`` asks for it again."""
    expired = approval_validity.expired(stored.snapshot, now=now, seq=stored.seq(), at=step.clock())
    return defer(stored, expired) if expired else stored


def _with_patches(step: Step, stored: StoredRun, patches: Sequence[str]) -> StoredRun:
    """A ``run.patch_taken`` for each of ``patches`` the run had not taken, deferred: written with
    what the decision writes next, before its events, and never without them, so a replay takes
    the patched branch exactly where the run took it."""
    run = stored.snapshot
    new = [patch for patch in patches if patch not in run.patches]
    if not new:
        return stored
    return defer(stored, [step.event(stored, ev.PatchTaken, offset=i, patch=patch,
                                     workflow_version=run.versions.workflow)
                          for i, patch in enumerate(new, 1)])
