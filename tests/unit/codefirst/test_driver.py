"""The replay driver and its journal, pure: no engine, a snapshot and a function."""

from __future__ import annotations

import asyncio
import random

import pytest

from longrun.author import CallTool, Context, DecisionContext, ScheduleRetry, WaitForEvent
from longrun.codefirst.driver import ForeignAwait, Parked, Raised, Returned, TooManyAwaits, drive
from longrun.codefirst.journal import Journal, ReplayDiverged, call_index
from longrun.domain import Budget, PinnedVersions, RunSnapshot, RunStatus, Usage, freeze
from longrun.domain.action import ActionRecord, ActionStatus, EffectKind, request_hash
from longrun.domain.snapshot import Fact

VERSIONS = PinnedVersions(workflow="1", prompt="p", model_policy="m", tool_schemas="t")


def snapshot(actions: tuple[ActionRecord, ...] = (), facts: tuple[Fact, ...] = (),
             patches: tuple[str, ...] = ()) -> RunSnapshot:
    return RunSnapshot(run_id="r1", tenant_id="t", kind="k", status=RunStatus.RUNNING, revision=1, last_seq=1,
                       created_at=100.0, status_since=100.0, goal=freeze({}), versions=VERSIONS,
                       budget=Budget(limit=Usage(model_calls=100, tool_calls=100, cost=100.0)),
                       actions=actions, facts=facts, patches=patches)


def confirmed(logical_action: str, tool: str, args: dict[str, object]) -> tuple[ActionRecord, Fact]:
    record = ActionRecord(logical_action=logical_action, tool=tool, tool_version="1", effect_kind=EffectKind.PURE,
                          status=ActionStatus.CONFIRMED, idempotency_key=f"k-{logical_action}",
                          request_hash=request_hash(tool, "1", args=freeze(args)))
    return record, Fact(f"receipt:{logical_action}", freeze({"ok": logical_action}), f"tool:{tool}", 150.0)


def journal(state: RunSnapshot) -> Journal:
    return Journal(state, DecisionContext(now=200.0, new_id=lambda: "id", rng=random.Random(0)))


async def two_calls(ctx: Context) -> str:
    first = await ctx.call_tool("echo", {"n": 1})
    second = await ctx.call_tool("echo", {"n": 2})
    return f"{first['ok']} {second['ok']}"


def run(fn, state: RunSnapshot, **options):  # type: ignore[no-untyped-def]
    j = journal(state)
    return drive(fn(Context(j)), j, **options)


def test_the_first_await_of_an_empty_history_is_the_decision() -> None:
    ended = run(two_calls, snapshot())
    assert isinstance(ended, Parked) and ended.index == 0
    assert ended.request.decision(0, 200.0) == CallTool(tool="echo", args=freeze({"n": 1}), logical_action="0:echo")


def test_recorded_awaits_resolve_from_the_history_in_order() -> None:
    a, fa = confirmed("0:echo", "echo", {"n": 1})
    b, fb = confirmed("1:echo", "echo", {"n": 2})
    parked = run(two_calls, snapshot((a,), (fa,)))
    assert isinstance(parked, Parked) and parked.index == 1
    assert run(two_calls, snapshot((a, b), (fa, fb))) == Returned("0:echo 1:echo")


def test_other_arguments_than_recorded_are_a_divergence_naming_both() -> None:
    a, fa = confirmed("0:echo", "echo", {"n": 7})
    with pytest.raises(ReplayDiverged) as raised:
        run(two_calls, snapshot((a,), (fa,)))
    assert raised.value.index == 0 and "{'n': 1}" in raised.value.asked and "'0:echo'" in raised.value.held


def test_a_history_longer_than_the_code_is_a_divergence() -> None:
    a, fa = confirmed("0:echo", "echo", {"n": 1})
    b, fb = confirmed("1:echo", "echo", {"n": 2})
    c, fc = confirmed("2:echo", "echo", {"n": 3})
    with pytest.raises(ReplayDiverged, match="#2"):
        run(two_calls, snapshot((a, b, c), (fa, fb, fc)))


def test_a_wait_where_the_history_marked_a_model_answer_is_a_divergence() -> None:
    async def waits(ctx: Context) -> None:
        await ctx.wait_event("ci", "ci/1", fact="ci_result:1", timeout=60)

    with pytest.raises(ReplayDiverged, match="model"):
        run(waits, snapshot(patches=("longrun.await:0:model:plan",)))


def test_a_parked_wait_names_its_deadline_from_the_live_clock_and_a_sleep_is_a_timer() -> None:
    async def waits(ctx: Context) -> None:
        await ctx.sleep(30)
        await ctx.wait_event("ci", "ci/1", fact="ci_result:1", timeout=60)

    ended = run(waits, snapshot())
    assert isinstance(ended, Parked)
    assert ended.request.decision(0, 200.0) == ScheduleRetry(logical_action="0:sleep", delay=30)
    ended = run(waits, snapshot(patches=("longrun.await:0:timer:130.0",)))
    assert isinstance(ended, Parked)
    assert ended.request.decision(1, 200.0) == WaitForEvent(kind="ci", correlation_key="ci/1", deadline=260.0)


def test_an_exception_the_function_raises_is_its_outcome() -> None:
    async def fails(ctx: Context) -> None:
        raise ValueError("no")

    ended = run(fails, snapshot())
    assert isinstance(ended, Raised) and str(ended.error) == "no"


@pytest.mark.parametrize("seconds", [0, 1], ids=["yields", "needs-a-loop"])
def test_awaiting_anything_but_the_context_is_a_determinism_error_named_clearly(seconds: float) -> None:
    async def sleeps(ctx: Context) -> None:
        await asyncio.sleep(seconds)

    with pytest.raises(ForeignAwait, match="await #0 awaited .* which is not a longrun await"):
        run(sleeps, snapshot())


def test_awaits_work_through_plain_await_chains_of_other_code() -> None:
    async def deep(ctx: Context, n: int) -> str:
        return await deep(ctx, n - 1) if n else (await ctx.call_tool("echo", {"n": 1}))["ok"]

    async def fn(ctx: Context) -> str:
        return await deep(ctx, 50)

    a, fa = confirmed("0:echo", "echo", {"n": 1})
    assert run(fn, snapshot((a,), (fa,))) == Returned("0:echo")


def test_a_function_past_its_await_limit_stops() -> None:
    async def loops(ctx: Context) -> None:
        while True:
            await ctx.sleep(1)

    marks = tuple(f"longrun.await:{i}:timer:1.0" for i in range(20))
    with pytest.raises(TooManyAwaits):
        run(loops, snapshot(patches=marks), limit=20)


def test_call_index_reads_the_await_of_a_logical_action() -> None:
    assert [call_index(n) for n in ("0:echo", "12.3:tour.echo", "branch", "commit:1")] == [0, 12, None, None]
