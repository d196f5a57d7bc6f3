"""A decision's calls made at once (``CallTools``), and its join.

Each call is what a single ``CallTool`` is: its own ledger row, idempotency key and effect kind, its
checks (arguments, scope, rate limits, health, permit), on record before it is sent (every call of a
fan-out, pure and read ones too, is submitted first, one commit each, watched by its durable timers),
then sent under ``supervise``. The calls run concurrently; each outcome is recorded as it arrives, one
at a time on the newest state (``Step.record_outcome`` rebuilds on a concurrent append). An outcome
never parks the run by itself: a rejected call is FAILED, an unavailable one RETRYABLE (or FAILED past
its retry policy), a write that timed out UNKNOWN.

Once the join is satisfied, ``run.joined`` records which calls satisfied it, in the order their
outcomes were recorded: the checkpoint ``decide`` goes on from, at once. The calls that lost it keep
running on this worker (``Step.in_flight``), each recording its outcome as it arrives; the turn does
not release the lease before they landed (``Step.landed``), and abandons them if it loses the lease.
If every call has its outcome and the join is not satisfied, a retryable call parks the run for its
retry, and a call in doubt parks it for the reconciler (``joins.holding`` at the top of the next round).

After a crash a new lease holder's ``decide`` asks for the same fan-out if it was not joined: calls
with an outcome are skipped, submitted pure, read and idempotent ones are sent again under their key
(the new fencing token), submitted non-idempotent writes go UNKNOWN for the reconciler: per call, as
single calls do. If it was joined, the losers still submitted are settled the same way before
``decide`` runs (``stragglers``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

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
    approvals = {c.logical_action: c.approval_id for c in decision.calls}
    return await send(far, step, stored, kind, calls, Joining(name, decision.logical_actions, decision.join),
                      approvals)


@dataclass(frozen=True, slots=True)
class Joining:
    """The join calls are made for: its name, all its calls, and how many of them it needs."""

    name: str
    calls: tuple[str, ...]
    join: joins.Join


async def send(far: FarSide, step: Step, stored: StoredRun, kind: RunKind, calls: Sequence[ToolRequest],
               joining: Joining, approvals: Mapping[str, str | None]) -> StoredRun | None:
    """``calls`` of ``joining`` made at once (submitted non-idempotent writes recorded UNKNOWN instead),
    until the join is satisfied or every call has its outcome; the state to go on from, or None once
    the run left."""
    run = stored.snapshot
    doubtful = [c for c in calls if _submitted_write(run, c)]
    admitted: list[Admitted] = []
    try:
        for call in calls:
            if call not in doubtful:
                admission = await admit(far, step, stored, kind, call, approvals.get(call.logical_action))
                if admission is None:
                    return None
                admitted.append(admission)
        for admission in admitted:
            stored = await on_record(far, step, stored, admission, list(admission.prepared))
        sent, admitted = admitted, []  # from here the calls free their permits once the last answered
        return await _Join(far, step, stored, joining).run(sent, doubtful)
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

    def __init__(self, far: FarSide, step: Step, stored: StoredRun, joining: Joining) -> None:
        self.far = far
        self.step = step
        self.latest = stored
        self.joining = joining
        self.arrived: list[str] = []
        self.retries: list[tuple[ToolRequest, answers.Retry]] = []
        self._lock = asyncio.Lock()
        self._sent: tuple[Admitted, ...] = ()
        self._running: list[Admitted] = []

    async def run(self, admitted: Sequence[Admitted], doubtful: Sequence[ToolRequest]) -> StoredRun | None:
        """The state to go on from once the join is satisfied (the calls still running left to
        ``Step.in_flight``) or every call has its outcome; None once the run parked for a retry."""
        step, run = self.step, self.latest.snapshot
        self._sent, self._running = tuple(admitted), list(admitted)
        making = {admission.call.logical_action: asyncio.create_task(self._make(run, admission))
                  for admission in admitted}
        try:
            for call in doubtful:
                await self._record(call, lambda s, c=call: answers.unknown(
                    step, s, c, "submitted before a crash; outcome not recorded", None))
            pending = set(making.values())
            while not await self._join() and pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # e.g. a heartbeat refused: the lease is no longer this turn's
        except BaseException:
            for task in making.values():
                task.cancel()
            await asyncio.gather(*making.values(), return_exceptions=True)
            raise
        step.in_flight.update({name: task for name, task in making.items() if not task.done()})
        latest = self.latest
        if (joins.joined(latest.snapshot, self.joining.name) is None and self.retries
                and latest.snapshot.status is RunStatus.RUNNING):
            call, retry = self.retries[0]
            await step.finish(latest, ev.WaitStarted, status=RunStatus.RETRY_SCHEDULED,
                              wait=answers.retry_wait(self.far, call, retry))
            return None
        return latest

    async def _make(self, run: RunSnapshot, admission: Admitted) -> None:
        try:
            await self._outcome(run, admission)
        finally:
            # A run holds one permit per tool group, however many of its calls it covers: freed once
            # the last call of the fan-out answered.
            self._running.remove(admission)
            if not self._running:
                for sent in self._sent:
                    await sent.permit.release()

    async def _outcome(self, run: RunSnapshot, admission: Admitted) -> None:
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

    async def _join(self) -> bool:
        """``run.joined`` once the join is satisfied (and the run still running: else the next turn
        writes it); whether it is on record."""
        step, joining = self.step, self.joining
        while True:
            stored = self.latest
            run = stored.snapshot
            if joins.joined(run, joining.name) is not None:
                return True
            if run.status is not RunStatus.RUNNING:
                return False
            by = joins.satisfied_by(run, joining.calls, joining.join, self.arrived)
            if by is None:
                return False
            try:
                self.latest = await step.commit(stored, [step.event(
                    stored, ev.RunJoined, join=joining.name, calls=joining.calls, by=by)])
                return True
            except StaleRevision:
                reloaded = await step.load(run.run_id)
                if reloaded is None:
                    raise LeaseLost(run.run_id, step.fence.token) from None
                self.latest = reloaded
