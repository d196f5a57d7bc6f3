"""Random runs: create, wait, wake, time out, cancel, pause, resume, act, charge, complete, late events.

Every step goes through ``evolve``. After each step the snapshot has no invariant
violation, equals the fold of the stored history, and round-trips through JSON; every
status change taken is in the declared table; a finished run never changes again.
Where the rules say an event must be accepted or refused, the machine checks that too.
"""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from longrun.domain import (
    ACTION_TRANSITIONS,
    AWAITING_ANSWER,
    IN_DOUBT,
    LATE_TOLERANT,
    MATCHED_BY_KEY,
    OPEN,
    RUN_TRANSITIONS,
    TERMINAL,
    UNRECONCILED,
    WAITING,
    ActionCompensated,
    ActionConfirmed,
    ActionEvent,
    ActionFailed,
    ActionPrepared,
    ActionReconciled,
    ActionResolved,
    ActionStatus,
    ActionSubmitted,
    ActionUnknown,
    ApprovalDecided,
    BudgetCharged,
    CancelRequested,
    DeadlinePassed,
    CompensationStarted,
    DecisionContext,
    EffectKind,
    FactRecorded,
    FrozenMap,
    ReconciliationStarted,
    RunCompleted,
    RunCreated,
    RunEvent,
    RunPaused,
    RunResumed,
    RunSnapshot,
    RunStatus,
    RunStatusChanged,
    RunTerminated,
    RunWoken,
    ScheduleRetry,
    Usage,
    Wait,
    WaitForEvent,
    WaitForUser,
    WaitStarted,
    WakeReason,
    evolve,
    fold,
    idempotency_key,
    is_late,
    remaining,
    violations,
    wait_for,
)
from longrun.errors import DomainError

from .support import VERSIONS

S = RunStatus
A = ActionStatus

# Action event -> the action status it moves to (None: the outcome comes from the event).
ACTION_STEPS: dict[type[ActionEvent], ActionStatus | None] = {
    ActionSubmitted: A.SUBMITTED,
    ActionConfirmed: A.CONFIRMED,
    ActionFailed: A.FAILED,
    ActionUnknown: A.UNKNOWN,
    ReconciliationStarted: A.RECONCILING,
    ActionReconciled: None,
    ActionResolved: None,
    CompensationStarted: A.COMPENSATING,
    ActionCompensated: A.COMPENSATED,
}
WAIT_KINDS = ["event", "sleep", "user", "retry"]
EXTRA_FIELDS: dict[type[ActionEvent], dict[str, Any]] = {
    ActionFailed: {"error": "422 rejected"},
    ActionUnknown: {"cause": "client timeout"},
    ActionResolved: {"by": "ops", "reason": "checked by hand"},
}


class RunMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[RunEvent] = []
        self.state: RunSnapshot | None = None
        self.now = 0.0
        self.applied = 0
        self.counter = 0

    @property
    def s(self) -> RunSnapshot:
        assert self.state is not None
        return self.state

    def new_id(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.counter}"

    def apply(self, cls: type[RunEvent], expect: bool | None, **fields: Any) -> bool:
        """Evolve with one event; ``expect`` says whether it must be accepted (True) or refused (False)."""
        event = cls(seq=len(self.events) + 1, at=self.now + 1.0, **fields)
        before = self.state
        try:
            after = evolve(before, event)
        except DomainError as exc:
            assert expect is not True, f"{event} was refused: {exc}"
            return False
        assert expect is not False, f"{event} was accepted on {before}"
        self.events.append(event)
        self.now = event.at
        if after is before:
            assert is_late(before, event)
        else:
            self.applied += 1
            assert before is None or before.status not in TERMINAL, "a finished run changed"
            if before is not None and after.status is not before.status:
                assert after.status in RUN_TRANSITIONS[before.status], (before.status, after.status)
        self.state = after
        return True

    def can_move(self, to: RunStatus) -> bool:
        return to in RUN_TRANSITIONS[self.s.status]

    def in_doubt(self) -> bool:
        return any(a.status in IN_DOUBT for a in self.s.actions)

    @initialize(limits=st.tuples(st.integers(2, 20), st.integers(2, 20), st.sampled_from([5.0, 20.0, 200.0])))
    def create(self, limits: tuple[int, int, float]) -> None:
        self.apply(RunCreated, True, run_id="run-1", tenant_id="t-1", kind="upgrade",
                   goal=FrozenMap({"goal": "upgrade"}), versions=VERSIONS, budget=Usage(*limits))  # fmt: skip

    def take(self) -> None:
        expect = True if self.s.status is S.READY else (None if self.can_move(S.RUNNING) else False)
        self.apply(RunStatusChanged, expect, to=S.RUNNING, reason="leased")

    def start_wait(self, kind: str, span: float) -> None:
        at = self.now + 1.0
        if kind == "sleep":
            status = S.WAITING_EVENT
            w = Wait(wait_id=self.new_id("w"), kind="timer", deadline=at + span, wake_at=at + span)
        else:
            decision = {
                "event": WaitForEvent(kind="ci", correlation_key=self.new_id("ci"), deadline=at + span),
                "user": WaitForUser(approval_id=self.new_id("ap"), owner="user_42", deadline=at + span,
                                    approved_hash="h-pr", summary="create the PR"),
                "retry": ScheduleRetry(logical_action="pr", delay=span),
            }[kind]  # fmt: skip
            ctx = DecisionContext(now=at, new_id=lambda: self.new_id("w"), rng=random.Random(0))
            status, w = wait_for(decision, ctx)
        self.apply(WaitStarted, self.s.status is S.RUNNING, status=status, wait=w)

    def wake(self, data: st.DataObject) -> None:
        w = self.s.wait
        if w is None:
            self.apply(RunWoken, True, wait_id="w-gone", reason=WakeReason.DEADLINE)  # late: nothing is pending
            return
        if w.approval_id is not None and data.draw(st.booleans()):
            same_hash = data.draw(st.booleans())
            hash_ = w.approved_hash if same_hash else "tampered"
            self.apply(ApprovalDecided, same_hash, approval_id=w.approval_id, approved=data.draw(st.booleans()),
                       approved_hash=hash_, decided_by="user_42")  # fmt: skip
            return
        reasons = [WakeReason.DEADLINE]
        reasons += [WakeReason.EVENT] if w.correlation_key else []
        reasons += [WakeReason.TIMER] if w.wake_at is not None else []
        reason = data.draw(st.sampled_from(reasons))
        key = w.correlation_key if reason is WakeReason.EVENT else None
        self.apply(RunWoken, True, wait_id=w.wait_id, reason=reason, correlation_key=key)

    def prepare(self) -> None:
        name = self.new_id("act")
        left = remaining(self.s.budget)
        settled = not self.with_status(*UNRECONCILED)
        expect = self.s.status is S.RUNNING and left.tool_calls > 0 and left.cost > 0 and settled
        self.apply(ActionPrepared, expect, logical_action=name, tool="create_pr", tool_version="1",
                   effect_kind=EffectKind.NON_IDEMPOTENT_WRITE, request_hash=f"h-{name}",
                   idempotency_key=idempotency_key("run-1", name, attempt_scope=1))  # fmt: skip

    def act(self, name: str, step: type[ActionEvent], outcome: ActionStatus) -> None:
        record = self.s.action(name)
        fields = dict(EXTRA_FIELDS.get(step, {}))
        if step in (ActionReconciled, ActionResolved):
            fields["outcome"] = outcome
        target = ACTION_STEPS[step] or outcome
        if self.s.status in TERMINAL:
            expect: bool | None = step.type in LATE_TOLERANT
        elif record is None or target not in ACTION_TRANSITIONS[record.status]:
            expect = False
        elif step is ActionSubmitted:
            expect = self.s.status is S.RUNNING and not self.with_status(*UNRECONCILED)
        elif step is CompensationStarted:
            expect = self.s.status in (S.RUNNING, S.CANCELLING)
        else:
            expect = True
        self.apply(step, expect, logical_action=name, **fields)

    def act_plausibly(self, data: st.DataObject, names: list[str]) -> None:
        """Move one of the named actions along a legal edge of its own table."""
        record = self.s.action(data.draw(st.sampled_from(names)))
        assert record is not None
        target = data.draw(st.sampled_from(sorted(ACTION_TRANSITIONS[record.status])))
        if record.status is A.RECONCILING:
            step: type[ActionEvent] = ActionReconciled
        elif record.status is A.NEEDS_ATTENTION:
            step = ActionResolved
        else:
            step = next(cls for cls, to in ACTION_STEPS.items() if to is target)
        self.act(record.logical_action, step, target)

    def complete(self, *, unmet: bool) -> None:
        expect = self.s.status is S.RUNNING and not unmet and not self.in_doubt()
        unmet_conditions = ("ci green",) if unmet else ()
        self.apply(RunCompleted, expect, evidence=FrozenMap({"ci": "green"}), unmet=unmet_conditions)

    @precondition(lambda self: self.s.status in (S.READY, S.ACTION_UNKNOWN))
    @rule()
    def lease_and_run(self) -> None:
        self.take()

    @precondition(lambda self: self.s.status is S.RUNNING)
    @rule(kind=st.sampled_from(WAIT_KINDS), span=st.floats(0, 500))
    def step_waits(self, kind: str, span: float) -> None:
        self.start_wait(kind, span)

    @precondition(lambda self: self.s.status is S.RUNNING)
    @rule()
    def step_prepares_an_action(self) -> None:
        self.prepare()

    def with_status(self, *statuses: ActionStatus) -> list[str]:
        return [a.logical_action for a in self.s.actions if a.status in statuses]

    @precondition(lambda self: self.with_status(A.PREPARED, A.RETRYABLE))
    @rule(data=st.data())
    def action_is_submitted(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(self.with_status(A.PREPARED, A.RETRYABLE)))
        self.act(name, ActionSubmitted, A.SUBMITTED)

    @precondition(lambda self: self.with_status(A.SUBMITTED))
    @rule(data=st.data(), step=st.sampled_from([ActionUnknown, ActionConfirmed, ActionFailed]))
    def far_side_answers(self, data: st.DataObject, step: type[ActionEvent]) -> None:
        self.act(data.draw(st.sampled_from(self.with_status(A.SUBMITTED))), step, A.CONFIRMED)

    @precondition(lambda self: self.with_status(A.UNKNOWN, A.RECONCILING, A.NEEDS_ATTENTION))
    @rule(data=st.data())
    def reconciler_or_operator_settles(self, data: st.DataObject) -> None:
        self.act_plausibly(data, self.with_status(A.UNKNOWN, A.RECONCILING, A.NEEDS_ATTENTION))

    @precondition(lambda self: self.with_status(A.CONFIRMED, A.COMPENSATING))
    @rule(data=st.data())
    def compensation(self, data: st.DataObject) -> None:
        self.act_plausibly(data, self.with_status(A.CONFIRMED, A.COMPENSATING))

    @precondition(lambda self: self.s.status is S.RUNNING and not self.with_status(*UNRECONCILED))
    @rule()
    def step_times_out_on_a_tool_call(self) -> None:
        """One worker step: prepare, submit, lose the response, park the run for reconciliation."""
        before = len(self.s.actions)
        self.prepare()
        if len(self.s.actions) == before:
            return  # no budget room: the prepare was (rightly) refused
        name = self.s.actions[-1].logical_action
        self.act(name, ActionSubmitted, A.SUBMITTED)
        self.act(name, ActionUnknown, A.UNKNOWN)
        self.apply(RunStatusChanged, True, to=S.ACTION_UNKNOWN, reason="tool call timed out")

    @precondition(lambda self: self.s.status is S.RUNNING and self.with_status(*UNRECONCILED))
    @rule()
    def step_reports_unknown_outcome(self) -> None:
        self.apply(RunStatusChanged, True, to=S.ACTION_UNKNOWN, reason="tool call timed out")

    @precondition(lambda self: self.s.status is S.RUNNING)
    @rule(unmet=st.booleans(), now=st.integers(0, 2))
    def step_completes(self, unmet: bool, now: int) -> None:
        if now:  # most steps are not the last one
            return
        self.complete(unmet=unmet)

    @precondition(lambda self: self.s.status is S.RUNNING)
    @rule()
    def step_yields(self) -> None:
        self.apply(RunStatusChanged, True, to=S.READY, reason="step done")

    @precondition(lambda self: self.s.wait is not None)
    @rule(data=st.data())
    def wait_ends(self, data: st.DataObject) -> None:
        self.wake(data)

    @precondition(lambda self: self.s.status is S.PAUSED)
    @rule()
    def operator_resumes(self) -> None:
        self.apply(RunResumed, True, by="ops", reason="go")

    @precondition(lambda self: self.s.status is S.CANCELLING)
    @rule()
    def cancellation_finishes(self) -> None:
        # Cancelled by a request it ends CANCELLED, by its business deadline TIMED_OUT; never the other.
        end, other = (S.TIMED_OUT, S.CANCELLED) if self.s.deadline_passed else (S.CANCELLED, S.TIMED_OUT)
        self.apply(RunStatusChanged, False, to=other, reason="the other end")
        self.apply(RunStatusChanged, not self.in_doubt(), to=end, reason="every action settled")

    @precondition(lambda self: self.s.status is S.NEEDS_ATTENTION)
    @rule(to=st.sampled_from([S.READY, S.FAILED]))
    def operator_resolves(self, to: RunStatus) -> None:
        self.apply(RunStatusChanged, True, to=to, reason="operator resolved")

    @precondition(lambda self: self.s.status in TERMINAL)
    @rule(data=st.data())
    def late_events_after_the_end(self, data: st.DataObject) -> None:
        before = self.state
        late = data.draw(st.sampled_from(["charge", "wake", "fact"]))
        if late == "charge":
            self.apply(BudgetCharged, True, cost=1.0)
        elif late == "wake":
            self.apply(RunWoken, True, wait_id="w-1", reason=WakeReason.EVENT, correlation_key="ci-1")
        else:
            self.apply(FactRecorded, True, key="late", value=True, source="webhook:forge")
        assert self.state is before
        self.apply(RunResumed, False, by="ops", reason="reopen?")
        self.apply(RunStatusChanged, False, to=S.READY, reason="reopen?")

    @precondition(lambda self: self.s.status in OPEN)
    @rule(what=st.sampled_from(["pause", "cancel", "deadline", "timeout", "terminate", "fail", "finish_cancel",
                                "resume"]),
          now=st.integers(0, 5))  # fmt: skip
    def disrupt(self, what: str, now: int) -> None:
        """Operators, deadlines and cancellations arrive whenever they like (here: a sixth of the time)."""
        if now:
            return
        if what == "pause":
            self.apply(RunPaused, self.can_move(S.PAUSED), by="ops", reason="hold")
        elif what == "cancel":
            again = self.s.status is S.CANCELLING and self.s.deadline_passed  # refused with its own reason
            self.apply(CancelRequested, self.can_move(S.CANCELLING) and not again, by="user_42", reason="not needed")
        elif what == "deadline":
            # The business deadline cancels an open run for it; one already cancelling goes on as it was.
            self.apply(DeadlinePassed, self.s.status in OPEN and self.s.status is not S.CANCELLING,
                       reason="business_deadline: passed")
        elif what == "timeout":
            # Imposed (schedule-to-start), or the end of a deadline's cancel once nothing is in doubt.
            cancelling = self.s.status is S.CANCELLING
            expect = self.can_move(S.TIMED_OUT) and (not cancelling or (self.s.deadline_passed and not self.in_doubt()))
            self.apply(RunStatusChanged, expect, to=S.TIMED_OUT, reason="timed out")
        elif what == "terminate":
            self.apply(RunTerminated, self.s.status in OPEN, by="ops", reason="runaway")
        elif what == "fail":
            self.apply(RunStatusChanged, self.can_move(S.FAILED), to=S.FAILED, reason="permission denied")
        elif what == "finish_cancel":
            expect = self.s.status is S.CANCELLING and not self.in_doubt() and not self.s.deadline_passed
            self.apply(RunStatusChanged, expect, to=S.CANCELLED, reason="cancelled")
        else:
            self.apply(RunResumed, self.s.status is S.PAUSED, by="ops", reason="go")

    @rule(data=st.data(), what=st.sampled_from(["action", "wait", "status", "stale", "charge", "fact"]))
    def probe(self, data: st.DataObject, what: str) -> None:
        """Events a buggy or racing writer might send; the rules decide whether they apply."""
        if what == "action":
            names = [a.logical_action for a in self.s.actions] + ["ghost"]
            step = data.draw(st.sampled_from(list(ACTION_STEPS)))
            self.act(data.draw(st.sampled_from(names)), step, data.draw(st.sampled_from(A)))
        elif what == "wait":
            self.start_wait(data.draw(st.sampled_from(WAIT_KINDS)), data.draw(st.floats(0, 500)))
        elif what == "status":
            to = data.draw(st.sampled_from(sorted(OPEN) + sorted(TERMINAL)))
            self.apply(RunStatusChanged, None if self.can_move(to) else False, to=to, reason="arbitrary")
        elif what == "stale":
            before = self.state
            self.apply(RunWoken, True, wait_id="w-stale", reason=WakeReason.DEADLINE)
            stale = {"approval_id": "ap-x", "approved": True, "approved_hash": "h", "decided_by": "u"}
            self.apply(ApprovalDecided, True, **stale)
            assert self.state is before
        elif what == "charge":
            costs = st.sampled_from([0.0, 0.5, 2.0])
            self.apply(BudgetCharged, True, model_calls=data.draw(st.integers(0, 2)),
                       tool_calls=data.draw(st.integers(0, 2)), cost=data.draw(costs))  # fmt: skip
        else:
            value = data.draw(st.sampled_from(["red", "green"]))
            self.apply(FactRecorded, True, key="ci", value=value, source="webhook:forge")

    @invariant()
    def consistent(self) -> None:
        if self.state is None:
            return
        assert violations(self.state) == ()
        assert self.state.revision == self.applied
        assert fold(self.events) == self.state
        assert RunSnapshot.from_dict(json.loads(json.dumps(self.state.to_dict()))) == self.state
        parked = self.state.paused_from if self.state.status is S.PAUSED else self.state.status
        assert (self.state.wait is not None) == (parked in WAITING)


RunMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None, database=None)
TestRunMachine = RunMachine.TestCase


def test_a_key_matches_a_run_waiting_on_an_answer_or_paused_on_one() -> None:
    assert AWAITING_ANSWER == WAITING - {RunStatus.RETRY_SCHEDULED}
    assert MATCHED_BY_KEY == AWAITING_ANSWER | {RunStatus.PAUSED}
    assert not MATCHED_BY_KEY & TERMINAL
