"""A kind whose own code raises, under the testing kit (the runtime's worker over the memory store): each
failure recorded, retried on a durable timer after the kind's backoff, NEEDS_ATTENTION after its attempts,
and an operator's retry once the kind is fixed carries the run on; a step that goes through forgets the
failures before it."""

from __future__ import annotations

import pytest

from longrun.authoring import RunKind
from longrun.domain import (
    Complete,
    Decision,
    DecisionContext,
    FrozenMap,
    PinnedVersions,
    RetryPolicy,
    RunSnapshot,
    RunStatus,
    StepFailed,
    WaitForEvent,
    WakeReason,
    freeze,
)
from longrun.errors import DomainError
from longrun.testing.kit import Kit

POLICY = RetryPolicy(initial_interval=2.0, backoff_coefficient=3.0, maximum_interval=60.0, maximum_attempts=3,
                     jitter=0.0)


class Flaky:
    """Completes; with ``waits``, only once a wait of its own (a step that goes through) ended at its
    deadline. ``decide`` raises while ``decide_breaks`` is above zero (counting down), ``accept`` while
    ``accept_broken``."""

    def __init__(self, *, waits: bool = False) -> None:
        self.waits = waits
        self.decide_breaks = 0
        self.accept_broken = False

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        if self.decide_breaks > 0:
            self.decide_breaks -= 1
            raise KeyError("steps")
        if self.waits and (state.last_wake is None or state.last_wake.reason is not WakeReason.DEADLINE):
            return WaitForEvent(kind="tick", correlation_key=f"tick/{state.run_id}", deadline=ctx.now + 1.0)
        return Complete(evidence=freeze({"done": True}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        if self.accept_broken:
            raise RuntimeError("the acceptance check cannot read its evidence")
        return ()


def _kit(flaky: Flaky) -> Kit:
    versions = PinnedVersions(workflow="1", prompt="p", model_policy="m", tool_schemas="t")
    return Kit(RunKind("flaky", versions, flaky, {}, step_retry=POLICY))


def _failures(kit: Kit, run_id: str) -> list[StepFailed]:
    return [e for e in kit.world.store.history(run_id) if isinstance(e, StepFailed)]


def test_an_accept_that_raises_is_retried_after_the_backoff_then_needs_attention_and_a_retry_completes() -> None:
    flaky = Flaky()
    flaky.accept_broken = True
    with _kit(flaky) as kit:
        run_id = kit.start({})
        kit.settle()
        assert kit.status(run_id) is RunStatus.NEEDS_ATTENTION
        failures = _failures(kit, run_id)
        assert [(f.phase, f.error_type, f.attempt) for f in failures] == [("accept", "RuntimeError", n)
                                                                           for n in (1, 2, 3)]
        assert [f.retry.wake_at - f.at for f in failures if f.retry is not None] == [2.0, 6.0]
        gaps = [b.at - a.at for a, b in zip(failures, failures[1:], strict=False)]
        assert gaps == pytest.approx([2.0, 6.0], abs=0.01)
        failure = kit.snapshot(run_id).failure
        assert failure is not None and failure.attempt == 3
        assert kit.check() == []  # a failure of the kind's code is the run's, not a worker step lost

        flaky.accept_broken = False  # the fixed kind is deployed
        assert kit.world.operate(run_id, "retry")["status"] == "READY"
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED and kit.snapshot(run_id).failure is None
        assert kit.check() == []


def test_a_step_that_goes_through_forgets_the_failures_before_it() -> None:
    flaky = Flaky(waits=True)
    flaky.decide_breaks = 2  # two failures in a row, then the wait goes through
    with _kit(flaky) as kit:
        run_id = kit.start({})
        kit.settle(timers=False)
        kit.advance(2.0)
        kit.settle(timers=False)
        assert kit.snapshot(run_id).failure is not None and kit.snapshot(run_id).failure.attempt == 2
        kit.advance(6.0)
        kit.settle(timers=False)
        assert kit.status(run_id) is RunStatus.WAITING_EVENT and kit.snapshot(run_id).failure is None
        flaky.decide_breaks = 2  # two more: still under three in a row
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED
        assert [f.attempt for f in _failures(kit, run_id)] == [1, 2, 1, 2]


def test_only_a_run_that_needs_attention_is_retried() -> None:
    with _kit(Flaky()) as kit:
        run_id = kit.start({})
        kit.settle()
        with pytest.raises(DomainError, match="it is COMPLETED, not NEEDS_ATTENTION"):
            kit.world.operate(run_id, "retry")
