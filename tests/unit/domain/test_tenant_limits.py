"""A tenant's limits: the platform's defaults fill what a tenant leaves unset, a bad value is refused
naming it, and a change is checked against the ceiling setting by setting (a lower bound passes; a
higher one, or none where the ceiling has one, goes beyond it, naming both values)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from longrun.app import effects
from longrun.config import ConfigError, Settings
from longrun.domain import events as ev
from longrun.domain.ceiling import IN_FORCE, LIMITS_MAXIMUM, SET, beyond, effective
from longrun.domain.tenant_limits import PlatformDefaults, TenantLimits, bound_beyond, groups_beyond

DEFAULTS = PlatformDefaults(run_slots=4, token_budget=None, cost_budget=2.5)
bounds = st.one_of(st.none(), st.integers(0, 100))


def test_a_tenant_without_limits_has_the_platforms_defaults() -> None:
    assert TenantLimits("acme").in_force(DEFAULTS) == {"run_slots": 4, "token_budget": None, "cost_budget": 2.5,
                                                       "tool_concurrency": {}}
    own = TenantLimits("acme", run_slots=0, token_budget=1000, tool_concurrency={"forge.*": 2})
    assert own.in_force(DEFAULTS) == {"run_slots": 0, "token_budget": 1000, "cost_budget": 2.5,
                                      "tool_concurrency": {"forge.*": 2}}


@pytest.mark.parametrize("bad", [{"run_slots": -1}, {"token_budget": -5}, {"cost_budget": -0.1},
                                 {"tool_concurrency": {"forge.*": 0}}, {"tool_concurrency": {"": 1}}])
def test_a_negative_or_unnamed_limit_is_refused_naming_it(bad: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=next(iter(bad))):
        TenantLimits("acme", **bad)


@given(bounds, bounds)
def test_a_bound_is_beyond_a_ceiling_exactly_when_it_is_higher_or_missing(asked: int | None,
                                                                          ceiling: int | None) -> None:
    over = bound_beyond(asked, ceiling)
    within = ceiling is None or (asked is not None and asked <= ceiling)
    assert (over == ()) is within


def test_tool_groups_beyond_are_those_the_ceiling_bounds_and_the_change_leaves_unbounded_or_higher() -> None:
    assert groups_beyond({"forge.*": 2, "ci": 9}, {"forge.*": 3}) == ()
    assert groups_beyond({"forge.*": 4}, {"forge.*": 3, "ci": 1}) == ("ci", "forge.*")
    assert groups_beyond({}, None) == ()  # a ceiling lifted (null): no group bounded


def test_without_a_ceiling_the_limits_in_force_bound_a_tenants_admin() -> None:
    in_force = TenantLimits("acme", run_slots=3).in_force(DEFAULTS)
    ceiling = effective("acme", None, in_force, maximum=LIMITS_MAXIMUM)
    assert set(ceiling.origins.values()) == {IN_FORCE}
    assert beyond(TenantLimits("acme", run_slots=2).in_force(DEFAULTS), ceiling) is None
    why = beyond(TenantLimits("acme", run_slots=5, cost_budget=None).in_force(DEFAULTS), ceiling)
    assert why == ("tenant 'acme': run_slots 5 go beyond the ceiling's 3 (the value in force: no ceiling is set): "
                   "5 not within it")
    unlimited = TenantLimits("acme", run_slots=3).in_force(PlatformDefaults(3))
    assert "cost_budget unlimited go beyond the ceiling's 2.5" in str(beyond(unlimited, ceiling))


def test_a_set_ceiling_holds_for_the_settings_it_names_and_the_value_in_force_for_the_others() -> None:
    ceiling = effective("acme", {"run_slots": 10, "tools": ["*"]}, TenantLimits("acme").in_force(DEFAULTS),
                        version=3, maximum=LIMITS_MAXIMUM)
    assert ceiling.limits["run_slots"] == 10 and ceiling.origins["run_slots"] == SET
    assert ceiling.origins["cost_budget"] == IN_FORCE and "tools" not in ceiling.limits
    assert beyond(TenantLimits("acme", run_slots=10).in_force(DEFAULTS), ceiling) is None
    assert "(set by an admin of every tenant, v3)" in str(beyond(TenantLimits("acme", run_slots=11).in_force(DEFAULTS),
                                                                   ceiling))


def test_a_model_calls_tokens_and_cost_are_charged_to_its_tenant_only_with_budgets_to_charge() -> None:
    budgets = effects.TenantBudgets(period=86400, tokens_default=None, cost_default=1.0)
    calls = [ev.BudgetCharged(seq=2, at=0, model_calls=1, cost=0.25, tokens=300),
             ev.BudgetCharged(seq=3, at=0, tool_calls=1),
             ev.BudgetCharged(seq=4, at=0, model_calls=1, cost=0.5, tokens=100)]
    charge = effects.tenant_charge("acme", calls, budgets)
    assert charge is not None and (charge.tenant_id, charge.tokens, charge.cost) == ("acme", 400, 0.75)
    assert (charge.period, charge.tokens_default, charge.cost_default) == (86400, None, 1.0)
    assert effects.tenant_charge("acme", calls[1:2], budgets) is None  # a tool call charges no token or cost
    assert effects.tenant_charge("acme", calls, None) is None


def test_a_recorded_charge_without_tokens_reads_as_none() -> None:
    recorded = ev.event_from_dict({"type": "budget.charged", "seq": 3, "at": 1.0, "model_calls": 1, "cost": 0.1,
                                   "tool_calls": 0})
    assert isinstance(recorded, ev.BudgetCharged) and recorded.tokens == 0


def test_budget_settings_default_to_unlimited_daily_periods_and_name_a_bad_value() -> None:
    settings = Settings.from_env({})
    assert settings.tenant_defaults() == PlatformDefaults(4, None, None) and settings.tenant_budget_period == 86400
    assert Settings.from_env({"LONGRUN_TENANT_TOKEN_BUDGET": "5000", "LONGRUN_TENANT_COST_BUDGET": "1.5",
                              "LONGRUN_TENANT_BUDGET_PERIOD": "1h"}).tenant_defaults() == PlatformDefaults(4, 5000, 1.5)
    with pytest.raises(ConfigError, match="LONGRUN_TENANT_TOKEN_BUDGET"):
        Settings.from_env({"LONGRUN_TENANT_TOKEN_BUDGET": "-1"})
