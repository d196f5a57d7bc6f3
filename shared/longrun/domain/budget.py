"""Run budgets: limits and usage for model calls, tool calls and cost.

Responsibility: pure arithmetic over a run's budget, so the worker can refuse to start
work the run cannot afford and the run can end BUDGET_EXHAUSTED with a reason.

Invariants:
- Charges are non-negative; usage only grows.
- A dimension is *exhausted* when nothing remains (used >= limit): no new work of that
  kind may start. It is *over limit* when used > limit, which only a charge for work
  already in flight can cause; a snapshot over limit must be BUDGET_EXHAUSTED.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from longrun.errors import BudgetExhausted

DIMENSIONS: tuple[str, ...] = ("model_calls", "tool_calls", "cost")


@dataclass(frozen=True, slots=True)
class Usage:
    """An amount per dimension; used for limits, usage, charges and what remains."""

    model_calls: int = 0
    tool_calls: int = 0
    cost: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.model_calls + other.model_calls,
            self.tool_calls + other.tool_calls,
            self.cost + other.cost,
        )


@dataclass(frozen=True, slots=True)
class Budget:
    limit: Usage
    used: Usage = Usage()


def charge(budget: Budget, *, model_calls: int = 0, tool_calls: int = 0, cost: float = 0.0) -> Budget:
    """Record usage. Never refuses: the call already happened, so its cost is a fact."""
    if model_calls < 0 or tool_calls < 0 or cost < 0:
        raise ValueError(f"charges are non-negative: {model_calls=}, {tool_calls=}, {cost=}")
    return replace(budget, used=budget.used + Usage(model_calls, tool_calls, cost))


def exhausted(budget: Budget, dimensions: tuple[str, ...] = DIMENSIONS) -> str | None:
    """The first of ``dimensions`` with nothing left, or None while each of them has room."""
    return next(
        (dim for dim in dimensions if getattr(budget.used, dim) >= getattr(budget.limit, dim)),
        None,
    )


def over_limit(budget: Budget) -> tuple[str, ...]:
    """Dimensions whose usage exceeds the limit."""
    return tuple(dim for dim in DIMENSIONS if getattr(budget.used, dim) > getattr(budget.limit, dim))


def remaining(budget: Budget) -> Usage:
    """What is left per dimension, never negative."""
    return Usage(
        max(0, budget.limit.model_calls - budget.used.model_calls),
        max(0, budget.limit.tool_calls - budget.used.tool_calls),
        max(0.0, budget.limit.cost - budget.used.cost),
    )


def ensure_room(budget: Budget, *dimensions: str) -> None:
    """Raise ``BudgetExhausted`` for the first named dimension with nothing left."""
    for dim in dimensions:
        used, limit = getattr(budget.used, dim), getattr(budget.limit, dim)
        if used >= limit:
            raise BudgetExhausted(dim, used, limit)
