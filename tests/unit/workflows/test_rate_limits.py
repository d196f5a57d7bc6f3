"""A rate-limited tool under the testing kit: calls past the limit wait for their place in line,
uncharged, each woken once by its own timer, and every run completes."""

from __future__ import annotations

import dataclasses

from longrun.authoring import RunKind
from longrun.domain import AskModel, Complete, Decision, DecisionContext, FrozenMap, RunSnapshot, RunStatus, freeze
from longrun.domain.rate_limit import RATE_LIMIT_PREFIX, RATE_LIMIT_WAIT, RateLimit, Unit
from longrun.model import ScriptedModel, Usage
from longrun.testing.kit import Kit
from longrun.workflows import STEPS_VERSIONS, steps

ECHO = dataclasses.replace(steps.ECHO, rate_limits=(RateLimit("echo", amount=2, period=1.0, burst=1),))
KIND = RunKind(steps.KIND, STEPS_VERSIONS, steps.Steps(), {ECHO.name: ECHO})


def test_calls_past_the_limit_wait_uncharged_for_their_place_and_each_is_woken_once() -> None:
    with Kit(KIND) as kit:
        run_ids = [kit.start({"steps": 1}) for _ in range(4)]
        kit.settle(timers=False)
        # The bucket's one call went; the three others wait, one refill (half a second) apart, showing the limit
        waiting = [kit.snapshot(r) for r in run_ids if kit.status(r) is not RunStatus.COMPLETED]
        assert len(waiting) == 3
        assert {(r.wait.kind, r.wait.correlation_key) for r in waiting if r.wait} == {
            (RATE_LIMIT_WAIT, RATE_LIMIT_PREFIX + "echo")}
        now = kit.world.clock()
        assert sorted(round(r.wait.wake_at - now, 3) for r in waiting if r.wait) == [0.5, 1.0, 1.5]
        assert all(r.budget.used.tool_calls == 0 for r in waiting)  # waiting costs the run nothing
        kit.settle()
        for run_id in run_ids:
            run = kit.snapshot(run_id)
            assert run.status is RunStatus.COMPLETED and run.budget.used.tool_calls == 1
            wakes = [e for e in kit.world.store.history(run_id) if e.type == "run.woken"]
            assert len(wakes) <= 1  # one extra wake per limited call, and none for the one that went
        assert kit.executions(ECHO.name) == 4
        assert kit.check() == []


class Asking:
    """Asks the model once for "plan", then completes."""

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        if state.fact("proposal:plan:1") is None:
            return AskModel(purpose="plan")
        return Complete(evidence=freeze({}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


ASKING = RunKind("asking", STEPS_VERSIONS, Asking(), {}, allowed_actions=lambda state, purpose: ("finish",))
MODEL = ScriptedModel({"plan": [{"action": "finish", "args": {}, "rationale": "done"}]},
                      usage=Usage(input_tokens=300, output_tokens=20, cost_usd=0.0))


def test_model_calls_wait_for_their_tokens_and_give_back_what_they_did_not_use() -> None:
    tokens = RateLimit("model-tokens", amount=4000, period=6.0, burst=3000, unit=Unit.TOKENS)
    with Kit(ASKING, model=MODEL, model_limits=(tokens,)) as kit:
        run_ids = [kit.start({}) for _ in range(4)]
        kit.settle(timers=False)
        waiting = [kit.snapshot(r) for r in run_ids if kit.status(r) is RunStatus.RETRY_SCHEDULED]
        assert waiting and all(r.wait and r.wait.correlation_key == "rate_limit:model-tokens" for r in waiting)
        assert all(r.budget.used.model_calls == 0 for r in waiting)  # waiting costs the run nothing
        kit.settle()
        assert [kit.status(r) for r in run_ids] == [RunStatus.COMPLETED] * 4
        assert kit.check() == []


def test_what_a_model_call_reserved_and_did_not_use_is_given_back() -> None:
    tokens = RateLimit("model-tokens", amount=4000, period=6.0, burst=3000, unit=Unit.TOKENS)
    with Kit(ASKING, model=MODEL, model_limits=(tokens,)) as kit:
        run_id = kit.start({})
        kit.settle(timers=False)  # the clock stands still: nothing refills
        assert kit.status(run_id) is RunStatus.COMPLETED
        assert kit.world.rate_limits.buckets["model-tokens"].level == tokens.burst - 320  # the tokens it used


def test_a_model_call_bigger_than_the_token_bucket_needs_a_person_naming_the_limit() -> None:
    tokens = RateLimit("model-tokens", amount=100, period=6.0, burst=100, unit=Unit.TOKENS)
    with Kit(ASKING, model=MODEL, model_limits=(tokens,)) as kit:
        run_id = kit.start({})
        kit.settle()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.NEEDS_ATTENTION and run.budget.used.model_calls == 0
        (changed,) = [e for e in kit.world.store.history(run_id) if e.type == "run.status_changed"
                      and e.to is RunStatus.NEEDS_ATTENTION]  # type: ignore[attr-defined]
        assert "never fits: rate limit model-tokens's burst (its bucket's size) is 100" in changed.reason  # type: ignore[attr-defined]
