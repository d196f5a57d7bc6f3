"""The use cases under random interleavings, over in-memory ports (``longrun.testing``): the workers are
the real ``Worker`` on the memory store, stepped one checkpoint at a time.

Where ``tests/unit/domain/test_run_machine.py`` drives ``evolve`` with events, this machine
drives the USE CASES: wakeups delivered (and delivered again), workers that take a lease and
step a run one commit at a time, die at any point (their lease left to expire) or stall
without renewing it, the timer service, the reconciler's sweeps, webhooks (twice), the
operator's cancel / pause / resume / approve / deny (with the right or a wrong hash), a far
side that times out after acting, refuses, or is unavailable, and a clock that jumps.

After every step: every snapshot has no invariant violation and is the fold of its stored
history; the ledger agrees with each run's record; no non-idempotent request was executed
twice; every worker write carried the fence the store held at that moment, and a stale
worker never added an event; a repeated delivery changed nothing; no webhook sits unmatched
while a run waits for it; and no worker step failed with anything but a lost lease. At the
end every run is settled (everything restarted, approvals given, webhooks sent, the clock run
forward) and must reach a terminal state or a person's desk with a complete, explained ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


import logging

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from longrun.app.reconciler.settle import ABANDONED_AFTER
from longrun.domain import TERMINAL, ActionStatus, RunStatus, violations
from longrun.errors import DomainError
from longrun.ports.runs import Fence
from longrun.testing.invariants import _history, _ledger
from longrun.testing.workers import MemoryWorker, Steps
from longrun.testing.world import (
    APPROVAL_ID,
    FAULTS,
    GATED_KIND,
    PUBLISH,
    FarSide,
    Webhook,
    World,
    ci_key,
)

S = RunStatus
TTL = 5.0
WORKERS = ("w1", "w2")
MAX_RUNS = 3
SETTLED = TERMINAL | {S.NEEDS_ATTENTION}


@dataclass
class Activation:
    worker: str
    run_id: str
    fence: Fence
    steps: Steps


class _Failures(logging.Handler):
    """What the workers log: a failed step (an error) and a lost lease (a warning)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.errors: list[str] = []
        self.lost = False

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self.errors.append(f"{record.getMessage()}: {record.exc_info[1] if record.exc_info else ''}")
        elif "lost" in record.getMessage():
            self.lost = True

    def take(self) -> list[str]:
        errors, self.errors, self.lost = self.errors, [], False
        return errors


class UseCases(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World(far_side=FarSide(fencing=True), lease_ttl=TTL)
        self.generation = dict.fromkeys(WORKERS, 0)
        self.drivers = {w: self._driver(w) for w in WORKERS}
        self.stalled: set[str] = set()
        self.activations: list[Activation] = []
        self.failures: list[str] = []
        self.runs: list[str] = []
        self.settling = False
        self.checked: dict[str, object] = {}
        self.seen: set[str] = set()
        """What this example exercised (reported as hypothesis events: the coverage of the search)."""
        self.log = _Failures()
        logging.getLogger("longrun.app.worker").addHandler(self.log)

    def _driver(self, worker: str) -> MemoryWorker:
        return MemoryWorker(self.world, f"{worker}.{self.generation[worker]}", lease_ttl=TTL)

    # -- helpers -----------------------------------------------------------------------------------
    def snapshot(self, run_id: str):  # type: ignore[no-untyped-def]
        stored = self.world.store.load(run_id)
        assert stored is not None
        return stored.snapshot

    def deliver_to(self, worker: str, index: int) -> None:
        message = self.world.pending.pop(index)
        self.world.delivered.append(message)
        driver = self.drivers[worker]
        outcome, duplicate = driver.on_wakeup(message)
        assert not duplicate
        if outcome["taken"]:
            fence = Fence(outcome["owner"], outcome["token"])
            self.activations.append(Activation(worker, message.run_id, fence, driver.advance(message.run_id, fence)))

    def step(self, activation: Activation, times: int) -> None:
        store = self.world.store
        for _ in range(times):
            row = store.runs[activation.run_id]
            stale = (row.lease_owner, row.fencing_token) != (activation.fence.owner, activation.fence.token)
            written = sum(1 for r in store.event_rows(activation.run_id) if r.fencing_token == activation.fence.token)
            try:
                next(activation.steps)
            except StopIteration:
                if stale and self.log.lost:
                    self.seen.add("a stale worker was fenced out")
                self.activations.remove(activation)
                return
            finally:
                # The worker logs a failed step and lets the lease expire; we record it.
                self.failures += self.log.take()
                if stale:
                    now = sum(1 for r in store.event_rows(activation.run_id)
                              if r.fencing_token == activation.fence.token)
                    assert now == written, f"a stale worker {activation.fence} wrote to {activation.run_id}"

    def operate(self, run_id: str, act: Callable[[], object], what: str, expect: bool | None) -> None:
        """An operator action; ``expect`` True/False: it must be accepted/refused (None: either)."""
        before = self.world.store.tables()
        try:
            act()
            if not self.settling:
                self.seen.add(f"operator {what} accepted")
        except DomainError as e:
            assert expect is not True, f"refused: {e}"
            assert self.world.store.tables() == before, "a refused operator action changed something"
            return
        assert expect is not False, "accepted an action that must be refused"

    def heartbeat(self) -> None:
        """Live (not stalled) workers renew their leases, as their heartbeat task does every ttl/3."""
        for a in self.activations:
            if a.worker not in self.stalled:
                self.world.store.extend_lease(a.run_id, a.fence, TTL)

    # -- producers and the bus -----------------------------------------------------------------------
    @precondition(lambda self: len(self.runs) < MAX_RUNS)
    @rule(kind=st.sampled_from(["steps", GATED_KIND]), steps=st.integers(1, 3), tool_calls=st.integers(2, 8),
          again=st.booleans())
    def create(self, kind: str, steps: int, tool_calls: int, again: bool) -> None:
        key = f"key-{len(self.runs)}"
        run_id = self.world.create(tenant_id="t", key=key, kind=kind, goal={"steps": steps}, tool_calls=tool_calls)
        if again:  # the same request again: the same run, nothing new
            before = self.world.store.tables()
            assert self.world.create(tenant_id="t", key=key, kind=kind, goal={"steps": steps},
                                     tool_calls=tool_calls) == run_id
            assert self.world.store.tables() == before
        self.runs.append(run_id)

    @precondition(lambda self: self.world.pending)
    @rule(data=st.data(), worker=st.sampled_from(WORKERS), then=st.integers(0, 30))
    def deliver_wakeup(self, data: st.DataObject, worker: str, then: int) -> None:
        """A wakeup reaches a worker, which takes the lease and (often) gets on with it at once."""
        self.deliver_to(worker, data.draw(st.integers(0, len(self.world.pending) - 1)))
        taken = self.activations[-1] if self.activations and self.activations[-1].worker == worker else None
        if taken is not None and then:
            self.step(taken, then)

    @precondition(lambda self: self.world.delivered)
    @rule(data=st.data(), worker=st.sampled_from(WORKERS))
    def redeliver_wakeup(self, data: st.DataObject, worker: str) -> None:
        message = data.draw(st.sampled_from(self.world.delivered))
        before = self.world.store.tables()
        outcome, duplicate = self.drivers[worker].on_wakeup(message)
        assert duplicate, "a delivered wakeup was handled twice"
        self.seen.add("a wakeup delivered again was absorbed")
        assert self.world.store.tables() == before, "a duplicate delivery changed something"

    # -- workers ----------------------------------------------------------------------------------------
    @precondition(lambda self: any(a.worker not in self.stalled for a in self.activations))
    @rule(data=st.data(), times=st.integers(1, 8))
    def worker_steps(self, data: st.DataObject, times: int) -> None:
        live = [a for a in self.activations if a.worker not in self.stalled]
        self.step(data.draw(st.sampled_from(live)), times)

    @precondition(lambda self: self.activations)
    @rule(data=st.data())
    def worker_crashes(self, data: st.DataObject) -> None:
        """SIGKILL: every step in flight stops where it is; the leases are left to expire."""
        worker = data.draw(st.sampled_from(sorted({a.worker for a in self.activations})))
        for killed in [a for a in self.activations if a.worker == worker]:
            killed.steps.close()
        self.activations = [a for a in self.activations if a.worker != worker]
        self.stalled.discard(worker)
        self.generation[worker] += 1
        self.drivers[worker] = self._driver(worker)

    @precondition(lambda self: self.activations)
    @rule(worker=st.sampled_from(WORKERS))
    def worker_stalls(self, worker: str) -> None:
        """SIGSTOP: no steps and no heartbeats until it is resumed."""
        self.stalled.add(worker)

    @precondition(lambda self: self.activations)
    @rule(data=st.data())
    def worker_stalls_past_its_lease(self, data: st.DataObject) -> None:
        """A worker freezes mid-step (GC, SIGSTOP, a slow disk) for longer than its lease: the others
        keep renewing theirs, the reconciler re-wakes its run, and another worker may take it over."""
        frozen = data.draw(st.sampled_from(self.activations))
        self.stalled.add(frozen.worker)
        self.world.clock.advance(TTL + 1)
        self.heartbeat()
        self.world.rewake_expired_leases()

    @precondition(lambda self: self.stalled)
    @rule(worker=st.sampled_from(WORKERS))
    def worker_resumes(self, worker: str) -> None:
        self.stalled.discard(worker)

    # -- time, timers, the reconciler ------------------------------------------------------------------------
    @rule(seconds=st.sampled_from([0.5, 2.0, 3.0, 6.0, 30.0, 130.0, 400.0]))
    def time_passes(self, seconds: float) -> None:
        self.world.clock.advance(seconds)
        self.heartbeat()

    @rule()
    def timers_fire(self) -> None:
        self.world.fire_due_timers()

    @rule()
    def reconciler_sweeps(self) -> None:
        if self.world.rewake_expired_leases():
            self.seen.add("an expired lease was re-woken")
        for outcome in self.world.reconcile_unknown():
            self.seen.add(f"reconciled {outcome}")

    @rule(fault=st.sampled_from(FAULTS))
    def far_side_misbehaves_next(self, fault: str) -> None:
        self.world.far_side.arm(fault)

    # -- people and webhooks --------------------------------------------------------------------------------
    @precondition(lambda self: self.runs)
    @rule(data=st.data(), times=st.integers(1, 3))
    def ci_webhook(self, data: st.DataObject, times: int) -> None:
        run_id = data.draw(st.sampled_from(self.runs))
        hook = Webhook(f"evt-{run_id}", ci_key(run_id), f"ci_result:{run_id}", {"status": "passed"})
        self.world.receive_webhook(hook)
        for _ in range(times - 1):
            before = self.world.store.tables()
            assert self.world.receive_webhook(hook).get("duplicate") is True
            assert self.world.store.tables() == before

    @precondition(lambda self: self.runs)
    @rule()
    def people_answer_what_is_asked(self) -> None:
        """Every waiting run gets its CI webhook or its approval (the right hash, approved)."""
        for _ in range(2 * MAX_RUNS):
            if not self._answer_people(resume=False):
                break

    @precondition(lambda self: self.runs)
    @rule(data=st.data(), right_hash=st.booleans(), approved=st.booleans())
    def approver_answers(self, data: st.DataObject, right_hash: bool, approved: bool) -> None:
        run_id = data.draw(st.sampled_from(self.runs))
        run = self.snapshot(run_id)
        wait = run.wait
        pending = wait is not None and wait.approval_id == APPROVAL_ID and run.status not in TERMINAL
        approved_hash = (wait.approved_hash if pending and right_hash else "0" * 64)  # type: ignore[union-attr]
        # Refused: a decision on another hash, and any decision the run does not ask for (NotPending).
        expect = right_hash if pending else False
        self.operate(run_id, lambda: self.world.decide(run_id, approval_id=APPROVAL_ID, approved_hash=approved_hash,
                                                       approved=approved), "approve" if approved else "deny", expect)

    @precondition(lambda self: self.runs)
    @rule(data=st.data(), what=st.sampled_from(["cancel", "pause", "resume", "terminate"]))
    def operator_acts(self, data: st.DataObject, what: str) -> None:
        run_id = data.draw(st.sampled_from(self.runs))
        status = self.snapshot(run_id).status
        expect = False if status in TERMINAL else None
        self.operate(run_id, lambda: self.world.operate(run_id, what), what, expect)

    # -- invariants ---------------------------------------------------------------------------------------
    @invariant()
    def every_run_is_consistent(self) -> None:
        store = self.world.store
        for run_id in self.runs:
            stored = store.load(run_id)
            assert stored is not None
            rows = store.for_run(run_id)
            state = (store.runs[run_id], tuple(rows))
            if self.checked.get(run_id) == state:
                continue  # unchanged since it was last checked
            history = store.history(run_id)
            assert violations(stored.snapshot) == ()
            assert _history(run_id, history, stored) == []
            assert _ledger(stored, rows, settled=False, history=history) == []
            self.checked[run_id] = state

    @invariant()
    def no_request_executed_twice_unless_repeatable(self) -> None:
        for (tool, key), n in self.world.far_side.executions.items():
            if tool == PUBLISH:
                assert n <= 1, f"{PUBLISH.effect.value} {key} executed {n} times"

    @invariant()
    def every_worker_write_carried_the_current_fence(self) -> None:
        for write in self.world.store.writes:
            assert (write.fence.owner, write.fence.token) == (write.owner_at_write, write.token_at_write), write

    @invariant()
    def no_webhook_waits_unmatched_for_a_waiting_run(self) -> None:
        for run_id in self.runs:
            run = self.snapshot(run_id)
            if run.status is S.WAITING_EVENT and run.wait is not None and run.wait.correlation_key:
                assert not self.world.unmatched_for(run.wait.correlation_key), \
                    f"{run_id} waits for {run.wait.correlation_key} while its webhook is kept unmatched"

    @invariant()
    def no_worker_step_failed(self) -> None:
        assert not self.failures, self.failures

    # -- the end: settle everything -------------------------------------------------------------------------
    def teardown(self) -> None:
        try:
            self.settle_and_check()
        finally:
            logging.getLogger("longrun.app.worker").removeHandler(self.log)
            self.world.close()

    def settle_and_check(self) -> None:
        if not self.runs:
            return
        self.settle()
        store = self.world.store
        for run_id in self.runs:
            stored = store.load(run_id)
            assert stored is not None
            run = stored.snapshot
            assert run.status in SETTLED, f"{run_id} did not settle: {run.status.value} {run.wait}"
            event(f"settled {run.kind} {run.status.value}")
            if any(not r.applied for r in store.event_rows(run_id)):
                self.seen.add("late events stored")
        for what in sorted(self.seen):
            event(what)
        for (tool, _), n in self.world.far_side.executions.items():
            if n > 1:
                event(f"{tool} re-ran after a crash")
            assert _ledger(stored, store.for_run(run_id), settled=True, history=store.history(run_id)) == []
        self.every_run_is_consistent()
        self.no_request_executed_twice_unless_repeatable()
        self.no_worker_step_failed()

    def settle(self) -> None:
        """Everyone back at work, people answer, time runs on, until nothing moves."""
        self.settling = True
        self.stalled.clear()
        self.world.far_side.armed.clear()
        waited = False
        for _ in range(400):
            if self.activations:
                self.step(self.activations[0], 50)
                continue
            if self.world.pending:
                self.deliver_to(WORKERS[0], 0)
                continue
            if self._answer_people():
                continue
            if self.world.in_doubt():
                self.world.reconcile_unknown()
                continue
            if self.world.store.expired_leases():
                self.world.rewake_expired_leases()
                continue
            if any(row.lease_owner is not None for row in self.world.store.runs.values()):
                self.world.clock.advance(TTL + 1)
                continue
            next_at = self.world.store.next_wake_at()
            if next_at is not None and any(self.snapshot(r).status not in SETTLED for r in self.runs):
                self.world.clock.advance(max(0.0, next_at - self.world.clock()) + 0.001)
                self.world.fire_due_timers()
                continue
            if not waited:
                # Last: the reconciler's patience with actions no worker will come back for.
                self.world.clock.advance(ABANDONED_AFTER + 1)
                waited = True
                continue
            break

    def _answer_people(self, *, resume: bool = True) -> bool:
        for run_id in self.runs:
            run = self.snapshot(run_id)
            if run.status is S.PAUSED and resume:
                self.operate(run_id, lambda: self.world.operate(run_id, "resume"), "resume", True)
                return True
            wait = run.wait
            if run.status is S.WAITING_USER and wait is not None:
                self.operate(run_id, lambda: self.world.decide(run_id, approval_id=APPROVAL_ID,
                                                               approved_hash=wait.approved_hash or ""), "approve", True)
                return True
            if run.status is S.WAITING_EVENT and wait is not None and wait.correlation_key:
                hook = Webhook(f"evt-settle-{run_id}", wait.correlation_key, f"ci_result:{run_id}", {"status": "passed"})
                self.world.receive_webhook(hook)
                return True
        return False


UseCases.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None, database=None,
                                      suppress_health_check=[HealthCheck.too_slow])
# ~25 s when it passes; shrinking a failure may take minutes, which pytest-timeout must not cut short.
TestUseCases = pytest.mark.timeout(900)(UseCases.TestCase)


def test_memory_far_side_counts_what_a_stale_worker_would_repeat_without_fencing() -> None:
    """Why the far side checks fencing tokens: without it, a worker that stalled between its commit and
    its request sends a non-idempotent request after reconciliation already proved nothing happened and
    the new owner resubmitted — the request runs twice. With fencing, the stale request is refused."""
    for fencing, expected in ((False, 2), (True, 1)):
        world = World(far_side=FarSide(fencing=fencing), lease_ttl=TTL)
        run_id = world.create(tenant_id="t", key="k", kind=GATED_KIND, goal={"steps": 0})
        hook = Webhook("evt", ci_key(run_id), f"ci_result:{run_id}", {"status": "passed"})
        old = _run_until(world, MemoryWorker(world, "old", lease_ttl=TTL), _publish_requested, hook)
        # the old worker stalls: its lease expires, the reconciler re-wakes the run for a new worker
        world.clock.advance(TTL + 1)
        world.rewake_expired_leases()
        new = MemoryWorker(world, "new", lease_ttl=TTL)
        message = world.pending.pop()
        outcome, _ = new.on_wakeup(message)
        for _ in new.advance(run_id, Fence(outcome["owner"], outcome["token"])):
            pass  # SUBMITTED non-idempotent: UNKNOWN, parked for reconciliation
        assert world.reconcile_unknown() == {"RETRYABLE": 1}  # the old request has not arrived yet
        message = world.pending.pop()
        outcome, _ = new.on_wakeup(message)
        for _ in new.advance(run_id, Fence(outcome["owner"], outcome["token"])):
            pass
        for _ in old:  # the stalled worker wakes up and sends its request
            pass
        assert world.far_side.executions[(PUBLISH, _publish_key(world, run_id))] == expected
        world.close()


def _publish_key(world: World, run_id: str) -> str:
    record = world.store.load(run_id).snapshot.action("publish")  # type: ignore[union-attr]
    assert record is not None
    return record.idempotency_key


def _publish_requested(world: World, run_id: str, at: str) -> bool:
    """The publish is on record as submitted and its worker is about to send it."""
    record = world.store.load(run_id).snapshot.action("publish")  # type: ignore[union-attr]
    return record is not None and record.status is ActionStatus.SUBMITTED and at == "tool request"


def _run_until(world: World, worker: MemoryWorker, done: Callable[[World, str, str], bool], hook: Webhook) -> Steps:
    """Drive one run through webhook and approval until ``done``; return its steps paused there."""
    while True:
        message = world.pending.pop(0)
        outcome, _ = worker.on_wakeup(message)
        assert message.run_id is not None
        steps = worker.advance(message.run_id, Fence(outcome["owner"], outcome["token"]))
        for at in steps:
            if done(world, message.run_id, at):
                return steps
        run = world.store.load(message.run_id).snapshot  # type: ignore[union-attr]
        if run.status is S.WAITING_EVENT:
            world.receive_webhook(hook)
        elif run.status is S.WAITING_USER:
            assert run.wait is not None
            world.decide(message.run_id, approval_id=APPROVAL_ID, approved_hash=run.wait.approved_hash or "")
