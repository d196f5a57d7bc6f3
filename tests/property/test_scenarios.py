"""Named interleavings of the use cases over the in-memory ports (the real ``Worker`` on the memory
store, stepped one checkpoint at a time), each one a story the random
machine (``test_use_cases.py``) can reach but rarely does: the publish request (a non-idempotent
write) lost at every point of its life, a cancel or a pause landing while a tool call is out,
a run ended while its request was out and its worker died. Each ends with the same checks as the
machine: consistent snapshots, a ledger that agrees and is explained, no request executed twice.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from longrun.app.reconciler.settle import ABANDONED_AFTER, ENDED_WHILE_SUBMITTED
from longrun.domain import TERMINAL, ActionStatus, RunStatus, violations
from longrun.domain import events as ev
from longrun.ports.runs import Fence
from longrun.testing.invariants import _history, _ledger
from longrun.testing.workers import MemoryWorker, Steps
from longrun.testing.world import (
    APPROVAL_ID,
    GATED_KIND,
    PUBLISH,
    FarSide,
    Webhook,
    World,
    ci_key,
)

S = RunStatus
A = ActionStatus
TTL = 5.0


class Story:
    """One run of the gated workflow and the people around it."""

    def __init__(self, *, steps: int = 1) -> None:
        self.world = World(far_side=FarSide(fencing=True), lease_ttl=TTL)
        self.run_id = self.world.create(tenant_id="t", key="k", kind=GATED_KIND, goal={"steps": steps})
        self.workers = 0

    @property
    def run(self):  # type: ignore[no-untyped-def]
        stored = self.world.store.load(self.run_id)
        assert stored is not None
        return stored.snapshot

    def publish(self):  # type: ignore[no-untyped-def]
        return self.run.action("publish")

    def worker(self) -> tuple[MemoryWorker, Steps]:
        """A fresh worker process takes the next wakeup."""
        self.workers += 1
        driver = MemoryWorker(self.world, f"worker-{self.workers}", lease_ttl=TTL)
        message = self.world.pending.pop(0)
        outcome, duplicate = driver.on_wakeup(message)
        assert not duplicate and outcome["taken"], outcome
        assert message.run_id is not None
        return driver, driver.advance(message.run_id, Fence(outcome["owner"], outcome["token"]))

    def step_until(self, steps: Steps, stop: Callable[[], bool]) -> bool:
        """Step until ``stop()`` holds (True: paused there) or the worker is done (False)."""
        for _ in steps:
            if stop():
                return True
        return False

    def people_answer(self) -> None:
        run = self.run
        if run.status is S.WAITING_EVENT:
            self.world.receive_webhook(Webhook(f"evt-{self.run_id}", ci_key(self.run_id), f"ci_result:{self.run_id}",
                                               {"status": "passed"}))
        elif run.status is S.WAITING_USER:
            assert run.wait is not None
            self.world.decide(self.run_id, approval_id=APPROVAL_ID, approved_hash=run.wait.approved_hash or "")

    def until_publish(self, status: ActionStatus, *, then: str = "tool request") -> Steps:
        """Run it through its steps, the webhook and the approval until the publish action is at
        ``status``; return the worker's steps paused at the first ``then`` checkpoint from there."""
        for _ in range(10):
            _, steps = self.worker()
            for point in steps:
                record = self.publish()
                if record is not None and record.status is status and point == then:
                    return steps
            self.people_answer()
        raise AssertionError(f"publish never reached {status.value} at {then}")

    def settle(self) -> None:
        """Everyone back, the reconciler and the clock move on, people answer, until the run ends."""
        for _ in range(50):
            if self.run.status in TERMINAL:
                return
            if self.world.pending:
                _, steps = self.worker()
                self.step_until(steps, lambda: False)
                continue
            if self.world.reconcile_unknown():
                continue
            self.people_answer()
            if not self.world.pending:
                self.world.clock.advance(TTL + 1)
                self.world.rewake_expired_leases()

    def executions(self) -> int:
        record = self.publish()
        assert record is not None
        return self.world.far_side.executions[(PUBLISH, record.idempotency_key)]

    def assert_consistent(self, *, settled: bool = True) -> None:
        store = self.world.store
        stored = store.load(self.run_id)
        assert stored is not None
        history = store.history(self.run_id)
        assert violations(stored.snapshot) == ()
        assert _history(self.run_id, history, stored) == []
        assert _ledger(stored, store.for_run(self.run_id), settled=settled, history=history) == []


def test_publish_times_out_after_acting_and_the_reconciler_finds_it_by_key() -> None:
    story = Story()
    steps = story.until_publish(A.SUBMITTED)
    story.world.far_side.arm("timeout_after_acting")
    story.step_until(steps, lambda: False)
    assert story.run.status is S.ACTION_UNKNOWN and story.publish().status is A.UNKNOWN
    assert story.world.reconcile_unknown() == {"CONFIRMED": 1}
    story.settle()
    assert story.run.status is S.COMPLETED
    assert story.executions() == 1
    story.assert_consistent()


@pytest.mark.parametrize("dies_at", ["tool request", "tool answered"])
def test_worker_dies_around_the_publish_request_and_it_happens_exactly_once(dies_at: str) -> None:
    # "tool request": SUBMITTED is stored, the request never left; "tool answered": the far side acted,
    # the answer died with the worker. Either way the next worker must not blind-retry it.
    story = Story()
    steps = story.until_publish(A.SUBMITTED, then=dies_at)
    steps.close()  # SIGKILL
    story.world.clock.advance(TTL + 1)
    assert story.world.rewake_expired_leases() == 1
    _, steps = story.worker()
    story.step_until(steps, lambda: False)
    assert story.run.status is S.ACTION_UNKNOWN and story.publish().status is A.UNKNOWN
    expected = {"tool request": {"RETRYABLE": 1}, "tool answered": {"CONFIRMED": 1}}[dies_at]
    assert story.world.reconcile_unknown() == expected
    story.settle()
    assert story.run.status is S.COMPLETED
    assert story.executions() == 1
    story.assert_consistent()


def test_a_cancel_while_the_request_is_out_waits_for_the_reconciler_then_cancels() -> None:
    # The answer (a timeout) is recorded on the cancelling run without the move to ACTION_UNKNOWN,
    # which CANCELLING does not allow; before the fix the worker's step failed and recorded nothing.
    story = Story()
    steps = story.until_publish(A.SUBMITTED)
    story.world.operate(story.run_id, "cancel", reason="stop")
    story.world.far_side.arm("timeout_after_acting")
    assert not story.step_until(steps, lambda: False)
    assert story.run.status is S.CANCELLING and story.publish().status is A.UNKNOWN
    assert story.world.store.runs[story.run_id].lease_owner is None
    assert story.world.reconcile_unknown() == {"CONFIRMED": 1}
    story.settle()
    assert story.run.status is S.CANCELLED
    assert story.executions() == 1
    story.assert_consistent()


def test_a_pause_while_the_request_is_out_keeps_the_unknown_outcome_for_after_the_resume() -> None:
    story = Story()
    steps = story.until_publish(A.SUBMITTED)
    story.world.operate(story.run_id, "pause", reason="hold")
    story.world.far_side.arm("timeout_after_acting")
    assert not story.step_until(steps, lambda: False)
    assert story.run.status is S.PAUSED and story.publish().status is A.UNKNOWN
    story.world.operate(story.run_id, "resume", reason="go")
    _, steps = story.worker()
    story.step_until(steps, lambda: False)
    # The resumed run does not decide while an outcome is unknown: it parks for the reconciler.
    assert story.run.status is S.ACTION_UNKNOWN
    story.settle()
    assert story.run.status is S.COMPLETED
    assert story.executions() == 1
    story.assert_consistent()


def test_a_run_terminated_while_its_request_is_out_still_gets_its_action_settled() -> None:
    story = Story()
    # The publish is SUBMITTED (committed), its request not yet sent...
    steps = story.until_publish(A.SUBMITTED)
    story.world.operate(story.run_id, "terminate", reason="x")
    steps.close()  # ...and the worker dies.
    story.world.clock.advance(TTL + 1)
    story.world.rewake_expired_leases()
    assert story.run.status is S.TERMINATED
    story.assert_consistent(settled=False)
    # Nobody comes back for a finished run: once the reconciler's patience is over (a worker still
    # in its call would have answered by then), it asks the far side by key and settles the action
    # with late events; only the ledger moves on.
    assert story.world.reconcile_unknown() == {}
    story.world.clock.advance(ABANDONED_AFTER)
    assert story.world.reconcile_unknown() == {"RETRYABLE": 1}
    late = [e for e in story.world.store.history(story.run_id) if e.seq > story.run.last_seq]
    assert [type(e) for e in late] == [ev.ActionUnknown, ev.ReconciliationStarted, ev.ActionReconciled]
    assert late[0].cause == ENDED_WHILE_SUBMITTED  # type: ignore[attr-defined]
    story.assert_consistent(settled=True)


def test_a_pure_step_whose_answer_died_with_its_worker_runs_again_charged_once() -> None:
    # A pure step is recorded with its answer (prepared, submitted, charged, confirmed at once): a
    # worker that dies between the answer and the record leaves nothing on record, so its successor
    # simply calls again, and the budget counts the call that was recorded.
    world = World(lease_ttl=TTL)
    run_id = world.create(tenant_id="t", key="k", kind="steps", goal={"steps": 3}, tool_calls=2)
    worker = MemoryWorker(world, "w1", lease_ttl=TTL)
    message = world.pending.pop(0)
    outcome, _ = worker.on_wakeup(message)
    steps = worker.advance(run_id, Fence(outcome["owner"], outcome["token"]))
    answers = 0
    for at in steps:
        answers += at == "tool answered"
        if answers == 2:
            break  # the second (and last affordable) step answered; the worker dies before recording it
    steps.close()
    world.clock.advance(TTL + 1)
    world.rewake_expired_leases()
    worker = MemoryWorker(world, "w2", lease_ttl=TTL)
    outcome, _ = worker.on_wakeup(world.pending.pop(0))
    for _ in worker.advance(run_id, Fence(outcome["owner"], outcome["token"])):
        pass
    stored = world.store.load(run_id)
    # The successor called step 1 again and recorded it (one charge); the third step found no budget
    # left and was never prepared
    assert stored is not None and stored.snapshot.status is S.BUDGET_EXHAUSTED
    assert stored.snapshot.terminal_reason == "budget tool_calls exhausted"
    assert stored.snapshot.budget.used.tool_calls == 2
    assert [(a.logical_action, a.status) for a in stored.snapshot.actions] == [
        ("step:0", A.CONFIRMED), ("step:1", A.CONFIRMED)]
    assert sorted(world.far_side.executions.values()) == [1, 2]
    history = world.store.history(run_id)
    assert _ledger(stored, world.store.for_run(run_id), settled=True, history=history) == []
    world.close()


def test_the_same_webhook_three_times_makes_one_transition() -> None:
    story = Story(steps=0)
    _, steps = story.worker()
    story.step_until(steps, lambda: False)
    assert story.run.status is S.WAITING_EVENT
    hook = Webhook("evt-1", ci_key(story.run_id), f"ci_result:{story.run_id}", {"status": "passed"})
    first = story.world.receive_webhook(hook)
    revision = story.run.revision
    tables = story.world.store.tables()
    for _ in range(2):
        assert story.world.receive_webhook(hook) == {**first, "duplicate": True}
    assert story.run.revision == revision and story.world.store.tables() == tables
    assert len(story.world.pending) == 1


def test_a_webhook_that_arrives_while_the_run_is_paused_takes_effect_on_resume() -> None:
    story = Story(steps=0)
    _, steps = story.worker()
    story.step_until(steps, lambda: False)
    story.world.operate(story.run_id, "pause", reason="hold")
    story.people_answer()  # nothing: paused
    story.world.receive_webhook(Webhook("evt-1", ci_key(story.run_id), f"ci_result:{story.run_id}",
                                        {"status": "passed"}))
    assert story.run.status is S.PAUSED and story.run.paused_from is S.READY
    story.world.operate(story.run_id, "resume", reason="go")
    assert story.run.status is S.READY
    story.settle()
    assert story.run.status is S.COMPLETED
    story.assert_consistent()
