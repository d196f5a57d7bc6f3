"""A decision's calls made at once (``CallTools``), and its join.

Each call is what a single ``CallTool`` is: its own ledger row, idempotency key and effect kind, its
checks (arguments, scope, rate limits, health, permit), on record before it is sent (every call of a
fan-out, pure and read ones too, is submitted first, one commit each, watched by its durable timers),
then sent under ``supervise``. The calls run concurrently; each outcome is recorded as it arrives, one
at a time on the newest state (``Step.record_outcome`` rebuilds on a concurrent append). An outcome
never parks the run by itself: a rejected call is FAILED, an unavailable one RETRYABLE (or FAILED past
its retry policy), a write that timed out UNKNOWN.

The turn goes on once every call it made has its outcome on record (a first-or-N join included: its
losers are recorded before ``decide`` runs again, so the lease is never released under a call in
flight). Then, if the join is satisfied, ``run.joined`` records which calls satisfied it, in the order
their outcomes were recorded: the checkpoint ``decide`` goes on from. It is written only once no call
of the fan-out is still submitted, so a crash before it leaves the join to the next lease holder, whose
``decide`` asks for the same fan-out and makes the calls cut off. If the join is not satisfied, a
retryable call parks the run for its retry, and a call in doubt parks it for the reconciler
(``joins.holding`` at the top of the next round).

After a crash a new lease holder's ``decide`` asks for the same fan-out: calls with an outcome are
skipped, submitted pure, read and idempotent ones are sent again under their key (the new fencing
token), submitted non-idempotent writes go UNKNOWN for the reconciler: per call, as single calls do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from longrun.app.worker import tool_answers as answers
from longrun.app.worker.commit import Step, ToolRequest
from longrun.app.worker.far_side import FarSide
from longrun.app.worker.tool_call import Admitted, admit, attempt, healthy, on_record, requested
from longrun.authoring import RunKind
from longrun.domain import (ActionStatus, CallTools, RecoveryPolicy, RunSnapshot, RunStatus, joins, recovery_policy,
                            remaining)
from longrun.domain import events as ev
from longrun.errors import ActionOutcomeUnknown, LeaseLost, StaleRevision, ToolRejected, ToolUnavailable
from longrun.ports.runs import StoredRun

Outcome = Callable[[StoredRun], Awaitable[StoredRun | None]]


async def fan_out(far: FarSide, step: Step, stored: StoredRun, kind: RunKind, decision: CallTools) -> StoredRun | None:
    """The fan-out's calls still to make, made at once; the state to go on from, or None once the run left."""
    run, name = stored.snapshot, decision.join_name
    if joins.joined(run, name) is not None:
        await step.finish(stored, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION,
                          reason=f"decide asked again for join {name}, joined already")
        return None
    making = joins.to_make(run, decision.logical_actions)
    if not making and joins.satisfied_by(run, decision.logical_actions, decision.join) is None:
        # Nothing to make, none in doubt (that parked the run before deciding), yet not enough outcomes.
        states = ", ".join(f"{a.logical_action} {a.status.value}" for a in run.actions
                           if a.logical_action in decision.logical_actions)
        await step.finish(stored, ev.RunStatusChanged, to=RunStatus.NEEDS_ATTENTION,
                          reason=f"join {name} cannot be satisfied: {states}")
        return None
    left, needed = remaining(run.budget).tool_calls, joins.charged(run, decision.logical_actions)
    if needed > left:
        # Every call is charged when it is submitted: none is made unless all of them can be.
        await step.finish(stored, ev.RunStatusChanged, to=RunStatus.BUDGET_EXHAUSTED,
                          reason=f"budget tool_calls exhausted: join {name} needs {needed}, {left} left")
        return None
    wanted = {c.logical_action: c for c in decision.calls}
    calls: list[ToolRequest] = []
    for logical_action in making:
        request = await requested(step, stored, kind, wanted[logical_action])
        if request is None:
            return None
        calls.append(request)
    doubtful = [c for c in calls if _submitted_write(run, c)]
    admitted: list[Admitted] = []
    try:
        for call in calls:
            if call not in doubtful:
                admission = await admit(far, step, stored, kind, call, wanted[call.logical_action].approval_id)
                if admission is None:
                    return None
                admitted.append(admission)
        for admission in admitted:
            stored = await on_record(far, step, stored, admission, list(admission.prepared))
        return await _Join(far, step, stored, decision).run(admitted, doubtful)
    finally:
        for admission in admitted:
            await admission.permit.release()


def _submitted_write(run: RunSnapshot, call: ToolRequest) -> bool:
    """A non-idempotent write submitted before a crash: it may have happened, so it is never sent again."""
    record = run.action(call.logical_action)
    return (record is not None and record.status is ActionStatus.SUBMITTED
            and recovery_policy(call.tool.effect) is RecoveryPolicy.RECONCILE)


class _Join:
    """One fan-out's calls in flight: their outcomes recorded one at a time on the newest state."""

    def __init__(self, far: FarSide, step: Step, stored: StoredRun, decision: CallTools) -> None:
        self.far = far
        self.step = step
        self.latest = stored
        self.decision = decision
        self.arrived: list[str] = []
        self.retries: list[tuple[ToolRequest, answers.Retry]] = []
        self._lock = asyncio.Lock()

    async def run(self, admitted: Sequence[Admitted], doubtful: Sequence[ToolRequest]) -> StoredRun | None:
        step, run = self.step, self.latest.snapshot
        for call in doubtful:
            await self._record(call, lambda s, c=call: answers.unknown(
                step, s, c, "submitted before a crash; outcome not recorded", None))
        try:
            async with asyncio.TaskGroup() as group:
                for admission in admitted:
                    group.create_task(self._make(run, admission))
        except BaseExceptionGroup as failed:  # e.g. a heartbeat refused: the lease is no longer this turn's
            raise failed.exceptions[0] from None
        await self._join()
        latest = self.latest
        if (joins.joined(latest.snapshot, self.decision.join_name) is None and self.retries
                and latest.snapshot.status is RunStatus.RUNNING):
            call, retry = self.retries[0]
            await step.finish(latest, ev.WaitStarted, status=RunStatus.RETRY_SCHEDULED,
                              wait=answers.retry_wait(self.far, call, retry))
            return None
        return latest

    async def _make(self, run: RunSnapshot, admission: Admitted) -> None:
        far, step, call = self.far, self.step, admission.call
        tool = call.tool
        try:
            result = await attempt(far, step, run, admission, on_record=True)
        except (ActionOutcomeUnknown, TimeoutError) as e:
            cause = str(e) or type(e).__name__
            if tool.effect in answers.RECORDED_WITH_THE_ANSWER:
                await self._unavailable(admission, e, cause)
            else:
                await self._record(call, lambda s: answers.unknown(step, s, call, cause, None,
                                                                   last_error=cause))
            return
        except ToolUnavailable as e:
            await self._unavailable(admission, e, str(e))
            return
        except ToolRejected as e:
            await healthy(far, tool, probe=admission.probe)
            error = str(e)
            await self._record(call, lambda s: answers.failed(step, s, call, error))
            return
        step.crash_point("worker.after_tool_response_before_record")
        await healthy(far, tool, probe=admission.probe)
        await self._record(call, lambda s: answers.confirm(far, step, s, call, result))

    async def _unavailable(self, admission: Admitted, error: Exception, cause: str) -> None:
        """FAILED past the call's retry policy, else RETRYABLE, its retry kept for the join to park on."""
        step, call = self.step, admission.call
        async with self._lock:
            retry = await answers.retry_of(self.far, self.latest, call, error, probe=admission.probe, cause=cause)
        failure = retry.failure
        if failure is not None:
            await self._record(call, lambda s: answers.failed(step, s, call, failure))
            return
        self.retries.append((call, retry))
        await self._record(call, lambda s: answers.retry_later(step, s, call, cause))

    async def _record(self, call: ToolRequest, outcome: Outcome) -> None:
        async with self._lock:
            after = await outcome(self.latest)
            assert after is not None, "an outcome of a fan-out's call does not park the run"
            self.latest = after
            self.arrived.append(call.logical_action)

    async def _join(self) -> None:
        """``run.joined`` if the join is satisfied (and the run still running: else the next turn writes it)."""
        step, decision = self.step, self.decision
        while True:
            stored = self.latest
            run = stored.snapshot
            if run.status is not RunStatus.RUNNING or joins.joined(run, decision.join_name) is not None:
                return
            by = joins.satisfied_by(run, decision.logical_actions, decision.join, self.arrived)
            if by is None:
                return
            try:
                self.latest = await step.commit(stored, [step.event(
                    stored, ev.RunJoined, join=decision.join_name, calls=decision.logical_actions, by=by)])
                return
            except StaleRevision:
                reloaded = await step.load(run.run_id)
                if reloaded is None:
                    raise LeaseLost(run.run_id, step.fence.token) from None
                self.latest = reloaded

