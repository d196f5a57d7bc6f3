"""Retries of tool and model calls answered unavailable, under the testing kit: each attempt charged,
each delay a durable timer from the retry policy, exhaustion a recorded failure the run kind sees."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from longrun.authoring import RunKind, Tool, ToolResult
from longrun.domain import (
    ActionStatus,
    AskModel,
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    Fail,
    FrozenMap,
    PinnedVersions,
    RetryPolicy,
    RunSnapshot,
    RunStatus,
    freeze,
)
from longrun.errors import ToolUnavailable
from longrun.model import Proposal, Usage
from longrun.testing.kit import Kit, every_crash

VERSIONS = PinnedVersions(workflow="1", prompt="p1", model_policy="m1", tool_schemas="t1")
POLICY = RetryPolicy(initial_interval=1.0, backoff_coefficient=2.0, maximum_interval=60.0, maximum_attempts=3,
                     jitter=0.0)


class EchoArgs(BaseModel):
    text: str


async def _unused(args: Mapping[str, Any], key: str, token: int) -> ToolResult:
    raise AssertionError("the kit's far side answers")


class CallOnce:
    """Asks the model for a plan (if ``plan`` is in its goal), calls ``echo`` once, and fails naming
    the action's recorded failure when it failed."""

    kind = "call_once"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        if state.goal.get("plan") and state.fact("proposal:plan:1") is None:
            return AskModel(purpose="plan")
        record = state.action("echo")
        if record is not None and record.status is ActionStatus.FAILED:
            return Fail(reason=f"echo failed: {record.detail}")
        if record is None or record.status is not ActionStatus.CONFIRMED:
            return CallTool(tool="echo", args=freeze({"text": "hi"}), logical_action="echo")
        return Complete(evidence=freeze({"echo": True}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


def kind(policy: RetryPolicy = POLICY, *, model_retry: RetryPolicy | None = None,
         effect: EffectKind = EffectKind.IDEMPOTENT_WRITE) -> RunKind:
    echo = Tool("echo", "1", effect, EchoArgs, _unused, retry=policy)
    return RunKind("call_once", VERSIONS, CallOnce(), {"echo": echo}, lambda state, purpose: ("go",),
                   model_retry=model_retry)


def retry_delays(kit: Kit, run_id: str) -> list[float]:
    """Each retry's wait: how long after it started its timer was due."""
    return [round(e.wait.wake_at - e.at, 6) for e in kit.world.store.history(run_id)
            if e.type == "run.wait_started" and e.wait.kind == "timer"]


def unavailable_every_time(kit: Kit) -> None:
    for _ in range(10):
        kit.far_side.arm("unavailable")
    kit.start({"text": "hi"})
    kit.settle()


def test_each_attempt_is_charged_and_exhaustion_is_a_failure_the_run_kind_sees() -> None:
    with Kit(kind()) as kit:
        unavailable_every_time(kit)
        (run_id,) = kit.run_ids()
        run = kit.snapshot(run_id)
        # Three attempts, each charged, two durable waits of the policy's delays between them
        assert run.budget.used.tool_calls == 3
        assert retry_delays(kit, run_id) == [1.0, 2.0]
        types = [e.type for e in kit.world.store.history(run_id)]
        assert types.count("action.unavailable") == 2 and types.count("action.submitted") == 3
        # The action FAILED naming why, and decide saw it
        echo = run.action("echo")
        assert echo is not None and echo.status is ActionStatus.FAILED and echo.attempts == 3
        assert run.status is RunStatus.FAILED
        assert run.terminal_reason == "echo failed: retries exhausted after 3 attempts: " \
                                      "echo is unavailable and did not act: injected: nothing was done"
        assert kit.executions("echo") == 0
        assert kit.check() == []


def test_a_retry_storm_ends_in_budget_exhausted_not_forever() -> None:
    with Kit(kind(RetryPolicy(initial_interval=1.0, maximum_attempts=1000, jitter=0.0))) as kit:
        for _ in range(10):
            kit.far_side.arm("unavailable")
        run_id = kit.start({"text": "hi"}, tool_calls=4)
        kit.settle()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.BUDGET_EXHAUSTED
        assert run.budget.used.tool_calls == 4
        assert kit.check() == []


def test_a_call_that_answers_on_a_later_attempt_completes_once() -> None:
    with Kit(kind()) as kit:
        kit.far_side.arm("unavailable")
        kit.far_side.arm("unavailable")
        run_id = kit.start({"text": "hi"})
        kit.settle()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.COMPLETED
        assert run.budget.used.tool_calls == 3 and kit.executions("echo") == 1
        assert kit.check() == []


def test_an_error_type_the_policy_does_not_retry_fails_at_the_first_attempt() -> None:
    with Kit(kind(RetryPolicy(non_retryable_error_types=("ToolUnavailable",)))) as kit:
        kit.far_side.arm("unavailable")
        run_id = kit.start({"text": "hi"})
        kit.settle()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.FAILED and run.budget.used.tool_calls == 1
        assert run.terminal_reason is not None and "ToolUnavailable is not retried" in run.terminal_reason


def test_the_attempt_count_survives_a_worker_killed_anywhere() -> None:
    # The count is the ledger's (the action's submissions on record), not a worker's memory: whichever
    # worker takes over, the action fails after exactly the policy's attempts, each charged once.
    outcomes = every_crash(kind(), unavailable_every_time)
    assert len(outcomes) >= 3 * 2  # each attempt: before the request, after the commit
    for o in outcomes:
        (run_id,) = o.kit.run_ids()
        run = o.kit.snapshot(run_id)
        assert run.status is RunStatus.FAILED, (o.point, o.nth)
        assert run.budget.used.tool_calls == 3, (o.point, o.nth)
        assert "retries exhausted after 3 attempts" in (run.terminal_reason or ""), (o.point, o.nth)
        assert o.kit.check() == [], (o.point, o.nth)


def test_a_read_that_does_not_answer_is_asked_again_under_the_policy_not_reconciled() -> None:
    # Asking a read again changes nothing: no answer is a retry (charged, after the policy's delay),
    # never an UNKNOWN outcome for the reconciler.
    with Kit(kind(effect=EffectKind.READ)) as kit:
        kit.far_side.arm("timeout_after_acting")
        run_id = kit.start({"text": "hi"})
        kit.settle()
        run = kit.snapshot(run_id)
        types = [e.type for e in kit.world.store.history(run_id)]
        assert run.status is RunStatus.COMPLETED and "action.unknown" not in types
        assert types.count("action.unavailable") == 1 and retry_delays(kit, run_id) == [1.0]
        echo = run.action("echo")
        assert echo is not None and echo.status is ActionStatus.CONFIRMED and echo.attempts == 2
        assert run.budget.used.tool_calls == 2 and kit.executions("echo") == 2
        assert kit.check() == []


def test_a_read_that_never_answers_fails_after_the_policy_s_attempts_naming_why() -> None:
    with Kit(kind(effect=EffectKind.READ)) as kit:
        for _ in range(5):
            kit.far_side.arm("timeout_after_acting")
        run_id = kit.start({"text": "hi"})
        kit.settle()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.FAILED and run.budget.used.tool_calls == 3
        assert "retries exhausted after 3 attempts: " in (run.terminal_reason or "")
        assert "no answer after acting" in (run.terminal_reason or "")


def test_a_write_that_does_not_answer_is_unknown_for_the_reconciler_never_retried_blindly() -> None:
    with Kit(kind(effect=EffectKind.NON_IDEMPOTENT_WRITE)) as kit:
        kit.far_side.arm("timeout_after_acting")
        run_id = kit.start({"text": "hi"})
        kit.settle()
        types = [e.type for e in kit.world.store.history(run_id)]
        assert "action.unknown" in types and "action.unavailable" not in types
        # Without a lookup the reconciler cannot tell what happened: a person decides, nothing is re-sent.
        echo = kit.snapshot(run_id).action("echo")
        assert echo is not None and echo.attempts == 1 and kit.executions("echo") == 1
        assert kit.status(run_id) is RunStatus.NEEDS_ATTENTION


class Unavailable:
    """A model endpoint that answers unavailable ``times`` times, then proposes ``go``."""

    def __init__(self, times: int) -> None:
        self.times = times
        self.asked = 0

    async def propose(self, *, context: Mapping[str, Any], allowed_actions: Sequence[str]) -> Proposal:
        self.asked += 1
        if self.asked <= self.times:
            raise ToolUnavailable("model:test", "HTTP 503")
        return Proposal("go", {}, "planned", Usage(1, 1, 0.0))


def test_the_model_is_asked_again_after_the_policy_s_delays_each_ask_charged() -> None:
    model = Unavailable(times=2)
    with Kit(kind(model_retry=POLICY), model=model) as kit:
        run_id = kit.start({"text": "hi", "plan": True})
        kit.settle()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.COMPLETED and model.asked == 3
        assert run.budget.used.model_calls == 3
        assert retry_delays(kit, run_id) == [1.0, 2.0]
        retried = run.fact("model_retry:plan:1")
        assert retried is not None and retried.value["attempts"] == 2  # type: ignore[index]
        assert kit.check() == []


def test_a_model_unavailable_past_its_attempts_needs_attention() -> None:
    with Kit(kind(model_retry=POLICY), model=Unavailable(times=10)) as kit:
        run_id = kit.start({"text": "hi", "plan": True})
        kit.settle()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.NEEDS_ATTENTION and run.budget.used.model_calls == 3
        last = kit.world.store.history(run_id)[-1]
        assert last.type == "run.status_changed"
        assert last.reason == "model for 'plan': retries exhausted after 3 attempts: " \
                              "model:test is unavailable and did not act: HTTP 503"
        assert kit.check() == []
