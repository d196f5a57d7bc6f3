"""A tenant's limits: how many runs it may have admitted at once, how many model tokens and how much
cost its runs may spend per period, and how many calls to each tool group may be in flight at once.

Responsibility: the limits as a value, the platform's defaults filled in where a tenant sets none
(``in_force``), the check of a change against the tenant's ceiling (``domain.ceiling``, whose
comparisons for these settings live here), and the wait of a run whose tenant's budget is spent. A ``None`` budget or tool-group bound is unlimited.

Invariants:
- ``run_slots``, the budgets and each tool group's bound are never negative.
- A setting left ``None`` in a tenant's limits takes the platform's default, read when used: a
  changed default holds for every tenant that sets none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from longrun.domain.snapshot import Wait, Wake

LIMIT_SETTINGS = ("run_slots", "token_budget", "cost_budget", "tool_concurrency")
"""The settings of a tenant's limits, as its document and its ceiling name them."""


@dataclass(frozen=True, slots=True)
class PlatformDefaults:
    """What a tenant that sets nothing gets (configuration: ``AdmissionSettings``)."""

    run_slots: int
    token_budget: int | None = None
    cost_budget: float | None = None


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """A tenant's own limits: ``None`` takes the platform's default. ``version``: raised by every
    change; ``None`` when the tenant never set any."""

    tenant_id: str
    run_slots: int | None = None
    token_budget: int | None = None
    cost_budget: float | None = None
    tool_concurrency: Mapping[str, int] = field(default_factory=dict)
    version: int | None = None

    def __post_init__(self) -> None:
        for name in ("run_slots", "token_budget", "cost_budget"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or null (the platform's default), not {value}")
        for group, bound in self.tool_concurrency.items():
            if not group or bound < 1:
                raise ValueError(f"tool_concurrency: a tool group is named and bounded by an integer >= 1, "
                                 f"not {group!r}: {bound}")

    def document(self) -> dict[str, Any]:
        """The settings as the ceiling compares them and the API shows them."""
        return {"run_slots": self.run_slots, "token_budget": self.token_budget, "cost_budget": self.cost_budget,
                "tool_concurrency": dict(self.tool_concurrency)}

    def in_force(self, defaults: PlatformDefaults) -> dict[str, Any]:
        """Every setting as it holds now: the tenant's value, else the platform's default."""
        return {"run_slots": self.run_slots if self.run_slots is not None else defaults.run_slots,
                "token_budget": self.token_budget if self.token_budget is not None else defaults.token_budget,
                "cost_budget": self.cost_budget if self.cost_budget is not None else defaults.cost_budget,
                "tool_concurrency": dict(self.tool_concurrency)}


def bound_beyond(asked: float | None, ceiling: float | None) -> tuple[Any, ...]:
    """A bound (``None``: unlimited) beyond a ceiling (``None``: none): ``(asked,)``, else empty."""
    if ceiling is None:
        return ()
    return ("unlimited",) if asked is None else (asked,) if asked > ceiling else ()


def groups_beyond(asked: Mapping[str, int], ceiling: Mapping[str, int] | None) -> tuple[str, ...]:
    """The tool groups the ceiling bounds (``None``: none) that ``asked`` leaves unbounded or bounds higher."""
    if ceiling is None:
        return ()
    return tuple(g for g, most in sorted(ceiling.items()) if asked.get(g) is None or asked[g] > most)



TENANT_BUDGET_WAIT = "tenant_budget"
TENANT_BUDGET_PREFIX = "tenant_budget:"
"""A run parked because its tenant's budget is spent waits on ``tenant_budget:<tenant>``."""


def budget_wait(*, wait_id: str, tenant_id: str, purpose: str, until: float) -> Wait:
    """The wait of a run about to ask the model (for ``purpose``) while its tenant's budget is spent
    for the period ending at ``until``: woken by its own timer when the period rolls over, or by the
    key when an operator raises the budget."""
    return Wait(wait_id=wait_id, kind=TENANT_BUDGET_WAIT, deadline=until, wake_at=until,
                correlation_key=f"{TENANT_BUDGET_PREFIX}{tenant_id}", subject=f"model:{purpose}")


def woken_by_budget(last_wake: Wake | None, tenant_id: str) -> bool:
    """Whether the run's last wait was its tenant's budget, ended by an operator's raise."""
    return last_wake is not None and last_wake.correlation_key == f"{TENANT_BUDGET_PREFIX}{tenant_id}"
