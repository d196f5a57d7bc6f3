"""Payload models, one per (type, schema_version). Published contract: see schemas/.

A new version is a new class plus an upcaster from the previous one (``upcast.py``);
an old class stays as long as producers may still send it.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from longrun.envelope.model import Strict


class BudgetLimits(Strict):
    model_calls: int = Field(default=50, ge=0)
    tool_calls: int = Field(default=200, ge=0)
    cost_usd: float = Field(default=10.0, ge=0)


class RunCreateV1(Strict):
    """Legacy form: a single cost ceiling."""

    workflow: str = Field(min_length=1)
    idempotency_key: str = Field(min_length=1, max_length=200)
    input: dict[str, Any] = Field(default_factory=dict)
    priority: int = Field(default=5, ge=0, le=9)
    budget_usd: float = Field(default=10.0, ge=0)


class RunCreateV2(Strict):
    """Ask the scheduler to create a run; the same (tenant, idempotency_key) yields one run."""

    workflow: str = Field(min_length=1, description="Run kind, e.g. dependency_upgrade.")
    idempotency_key: str = Field(min_length=1, max_length=200)
    input: dict[str, Any] = Field(default_factory=dict, description="The goal and its parameters.")
    priority: int = Field(default=5, ge=0, le=9, description="0 lowest, 9 highest; aging lifts waiting runs.")
    budget: BudgetLimits = Field(default_factory=BudgetLimits)
    workflow_version: str | None = Field(default=None, description="Pin; the newest registered when absent.")
    labels: dict[str, str] = Field(default_factory=dict)


class RunWakeupV1(Strict):
    """Work message: the run to advance; all state is read from PostgreSQL."""

    wakeup_id: str = Field(min_length=1)
    reason: str = Field(min_length=1)


class RunEventV1(Strict):
    """A run event broadcast on the topic exchange for downstream consumers."""

    seq: int = Field(ge=1)
    event_type: str
    status: str
    data: dict[str, Any] = Field(default_factory=dict)


class RunRejectedV1(Strict):
    """A run.create that was refused, with the reason and, for key reuse, both hashes."""

    idempotency_key: str
    reason: str
    existing_run_id: str | None = None
    recorded_input_hash: str | None = None
    offered_input_hash: str | None = None
