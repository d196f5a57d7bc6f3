"""What a worker needs to ask the world: the model, the artifact store for large receipts, the far
sides' health (breakers) and rate limits, the tenants whose budgets are spent, the permits of the
tenants' bounded tool groups, and the retry policy of tools and models that declare none."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from longrun.artifacts import ArtifactStore
from longrun.authoring import Tool
from longrun.domain import DecisionContext, RetryPolicy, RunSnapshot, effective_start_to_close, next_delay, retryable
from longrun.domain.rate_limit import RateLimit
from longrun.model import ModelAdapter
from longrun.ports.rate_limits import RateLimits
from longrun.ports.stores import Breakers, SpentTenants
from longrun.ports.tool_permits import ToolPermits
from longrun.streaming import ProgressSink


@dataclass(frozen=True, slots=True)
class FarSide:
    model: ModelAdapter
    artifacts: ArtifactStore
    clock: Callable[[], float]
    rng: random.Random
    retry: RetryPolicy = RetryPolicy()
    breakers: Breakers | None = None
    """The far sides' health; without them, every far side is called whatever it answered before."""
    health_max_wait: float = 600.0
    """Seconds after which a run waiting for a far side to be healthy, or for a permit of a tool
    group, looks again by itself."""
    lease_ttl: float = 30.0
    spent_tenants: SpentTenants | None = None
    """Whose budgets are spent; without it, no run waits for its tenant's budget."""
    rate_limits: RateLimits | None = None
    """The far sides' token buckets; without them, no declared rate limit is enforced."""
    model_limits: tuple[RateLimit, ...] = ()
    """The model provider's rate limits (``LONGRUN_MODEL_*_PER_PERIOD``)."""
    model_max_tokens: int = 1024
    """What a model answer may use at most: reserved in a token limit with the call's input."""
    tool_permits: ToolPermits | None = None
    """The permits of the tenants' bounded tool groups; without them, no tool concurrency is enforced."""
    rate_limit_lead: float = 0.0
    """Seconds ahead of its place in line a limited call's run is woken (the worker waits out the
    rest): how late a wake may come without the call going later than its place."""
    progress: ProgressSink | None = None
    """Where calls' live output goes (``longrun.streaming``); without it, what they emit goes nowhere."""

    def context(self) -> DecisionContext:
        return DecisionContext(now=self.clock(), new_id=lambda: str(uuid.uuid4()), rng=self.rng)

    def retry_delay(self, policy: RetryPolicy, attempts: int, error: Exception,
                    cause: str) -> tuple[float | None, str]:
        """Seconds until the next attempt after ``attempts`` failed, the last with ``error`` (``cause``
        says what it was); or None, and why not, when the policy does not retry it."""
        if not retryable(policy, type_names(error)):
            return None, f"{type(error).__name__} is not retried: {cause}"
        return next_delay(policy, attempts, rng=self.rng), f"retries exhausted after {attempts} attempts: {cause}"


def type_names(error: Exception) -> list[str]:
    """The names of ``error``'s class and its bases: what ``RetryPolicy.non_retryable_error_types`` lists."""
    return [cls.__name__ for cls in type(error).__mro__]


def start_to_close(tool: Tool, run: RunSnapshot) -> float:
    """Seconds a call of ``tool`` for ``run`` may take, start to answer: what the worker watches and
    the call's durable timer is due after. The run's cap (``RunTimeouts.start_to_close``) may shorten
    the tool's limit, never lengthen it."""
    return effective_start_to_close(tool.start_to_close, run)
