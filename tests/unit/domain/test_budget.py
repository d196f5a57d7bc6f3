"""Budgets: charges add up, exhaustion names the dimension, remaining never goes negative."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longrun.domain import Budget, Usage, charge, ensure_room, exhausted, over_limit, remaining
from longrun.errors import BudgetExhausted


def test_charges_accumulate_per_dimension() -> None:
    budget = charge(charge(Budget(Usage(5, 5, 2.0)), model_calls=1, cost=0.5), tool_calls=2, cost=0.25)
    assert budget.used == Usage(1, 2, 0.75)
    with pytest.raises(ValueError, match="non-negative"):
        charge(budget, cost=-1.0)


def test_exhausted_names_the_first_dimension_with_nothing_left() -> None:
    assert exhausted(Budget(Usage(2, 2, 1.0))) is None
    assert exhausted(Budget(Usage(2, 2, 1.0), Usage(1, 2, 0.0))) == "tool_calls"
    assert exhausted(Budget(Usage(2, 2, 1.0), Usage(2, 2, 1.0))) == "model_calls"
    assert over_limit(Budget(Usage(2, 2, 1.0), Usage(2, 3, 1.5))) == ("tool_calls", "cost")


def test_ensure_room_refuses_work_the_budget_cannot_afford() -> None:
    budget = Budget(Usage(2, 1, 1.0), Usage(0, 1, 0.0))
    ensure_room(budget, "model_calls", "cost")
    with pytest.raises(BudgetExhausted) as caught:
        ensure_room(budget, "model_calls", "tool_calls")
    assert (caught.value.budget, caught.value.used, caught.value.limit) == ("tool_calls", 1, 1)


@settings(max_examples=100, deadline=None, database=None)
@given(
    limit=st.builds(Usage, st.integers(0, 9), st.integers(0, 9), st.floats(0, 9)),
    charges=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.floats(0, 3)), max_size=6),
)
def test_remaining_is_limit_minus_used_floored_at_zero(
    limit: Usage, charges: list[tuple[int, int, float]]
) -> None:
    budget = Budget(limit)
    for model_calls, tool_calls, cost in charges:
        budget = charge(budget, model_calls=model_calls, tool_calls=tool_calls, cost=cost)
    left = remaining(budget)
    assert left.model_calls == max(0, limit.model_calls - budget.used.model_calls)
    assert left.tool_calls == max(0, limit.tool_calls - budget.used.tool_calls)
    assert left.cost == max(0.0, limit.cost - budget.used.cost)
    assert (exhausted(budget) is None) == (left.model_calls > 0 and left.tool_calls > 0 and left.cost > 0)
