"""A code-first run kind: an async function of a typed input, made a ``Workflow`` (``decide``/``accept``)
by replay. On every wake ``decide`` replays the function against the run's history (``driver.drive``);
the first await the history holds no result for is the decision. Its return value (the output model)
completes the run, with the output as evidence; an exception it raises fails the run; a replay that
takes another path than the history stops the run in NEEDS_ATTENTION (``ReplayError``, not retried)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from pydantic import BaseModel, ValidationError

from longrun.codefirst.awaits import WAITS
from longrun.codefirst.context import Context
from longrun.codefirst.driver import MAX_AWAITS, Parked, Raised, Returned, drive
from longrun.codefirst.journal import WAIT_ID_PREFIX, Journal
from longrun.domain import Complete, Decision, DecisionContext, Fail, FrozenMap, RunSnapshot, freeze, thaw
from longrun.domain.action import UNRECONCILED

In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out", bound=BaseModel)
Function = Callable[[In, Context], Awaitable[Out]]
Acceptance = Callable[[RunSnapshot, Out], Sequence[str]]


class CodeFirst(Generic[In, Out]):
    """The ``Workflow`` the engine runs for an async function ``fn(input, ctx) -> output``."""

    def __init__(self, kind: str, fn: Function[In, Out], *, input: type[In], output: type[Out],
                 accept: Acceptance[Out] | None = None, max_awaits: int = MAX_AWAITS) -> None:
        self.kind, self.fn, self.input, self.output = kind, fn, input, output
        self._accept, self.max_awaits = accept, max_awaits

    async def __call__(self, value: In, ctx: Context) -> Out:
        return await self.fn(value, ctx)

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        journal = Journal(state, ctx)
        ended = drive(self.fn(self.input.model_validate(thaw(state.goal)), Context(journal)), journal,
                      limit=self.max_awaits)
        if isinstance(ended, Parked):
            if isinstance(ended.request, WAITS):
                _name_waits(ctx, ended.index)
            return ended.request.decision(ended.index, ctx.now)
        if isinstance(ended, Raised):
            return Fail(reason=f"{type(ended.error).__name__}: {ended.error}")
        return self._completed(ended)

    def _completed(self, ended: Returned) -> Decision:
        if not isinstance(ended.value, self.output):
            return Fail(reason=f"the function returned {type(ended.value).__name__}, not {self.output.__name__}")
        return Complete(evidence=freeze(ended.value.model_dump(mode="json")))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        """The output is evidence: it must still be a valid output, no action's outcome may be unknown,
        and the kind's own ``accept`` (if any) judges the rest."""
        try:
            output = self.output.model_validate(thaw(evidence))
        except ValidationError as e:
            return (f"the output is not a {self.output.__name__}: {e.error_count()} error(s)",)
        unmet = [f"action {a.logical_action} has no known outcome" for a in state.actions if a.status in UNRECONCILED]
        return (*unmet, *(self._accept(state, output) if self._accept is not None else ()))


def _name_waits(ctx: DecisionContext, index: int) -> None:
    """The wait the engine starts for this decision is named after the await (``await-<n>-<uuid>``), so the
    wake that ends it is known to belong to that await. The engine makes the id with ``ctx.new_id``."""
    new_id = ctx.new_id
    object.__setattr__(ctx, "new_id", lambda: f"{WAIT_ID_PREFIX}{index}-{new_id()}")


def workflow(kind: str, *, input: type[In], output: type[Out], accept: Acceptance[Out] | None = None,
             max_awaits: int = MAX_AWAITS) -> Callable[[Function[In, Out]], CodeFirst[In, Out]]:
    """Make ``async def fn(input: In, ctx: Context) -> Out`` the workflow of run kind ``kind``:

        @workflow("greet", input=GreetInput, output=GreetOutput)
        async def greet(value: GreetInput, ctx: Context) -> GreetOutput: ...

        RunKind("greet", VERSIONS, greet, tools, input_schema=GreetInput)
    """
    def wrap(fn: Function[In, Out]) -> CodeFirst[In, Out]:
        return CodeFirst(kind, fn, input=input, output=output, accept=accept, max_awaits=max_awaits)

    return wrap



