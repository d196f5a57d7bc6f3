"""The worker: how many runs it advances, how long it holds one, and its model."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from longrun.config import parse
from longrun.config.declaration import Concern, Problem, declared_variable, setting
from longrun.model import Price

PROVIDERS = ("openai", "anthropic")
"""The model providers the worker calls through their SDKs (``LONGRUN_MODEL`` besides scripted)."""


def _model_kind(raw: str) -> str:
    if raw not in ("scripted", *PROVIDERS):
        raise ValueError
    return raw


def _prices(raw: str) -> Mapping[str, Price]:
    """``{"<model>": {"input_per_mtok": 0.15, "output_per_mtok": 0.6}, ...}``: finite prices >= 0."""
    if not raw.strip():
        return {}
    table = json.loads(raw)
    if not isinstance(table, dict):
        raise ValueError
    prices = {}
    for model, price in table.items():
        if not isinstance(price, dict) or set(price) != {"input_per_mtok", "output_per_mtok"}:
            raise ValueError
        amounts = [price["input_per_mtok"], price["output_per_mtok"]]
        if not all(isinstance(a, int | float) and not isinstance(a, bool) and 0 <= a < float("inf") for a in amounts):
            raise ValueError
        prices[model] = Price(*map(float, amounts))
    return prices


@dataclass(frozen=True)
class WorkerSettings(Concern):
    """Worker: runs in hand and the model"""

    run_lease_ttl: float = setting("LONGRUN_RUN_LEASE_TTL", parse.positive_float, "seconds, a number > 0", "30")
    """Seconds a worker keeps a run without a heartbeat (a dead worker's runs are taken over sooner, once
    its membership lapses: ``LONGRUN_PARTITION_LEASE_TTL``)."""
    worker_concurrency: int = setting("LONGRUN_WORKER_CONCURRENCY", parse.positive_int, "an integer >= 1", "64")
    """Runs one worker process advances at once."""
    worker_stop_grace: float = setting("LONGRUN_WORKER_STOP_GRACE", parse.non_negative_float,
                                       "seconds, a number >= 0", "30")
    """Seconds a stopping worker (SIGTERM) gives the rounds in hand to finish: a call in flight is
    answered and recorded, and each run is handed on to a live worker. A call still running then is
    ended, and its run taken over as the worker leaves. Keep it under the orchestrator's grace period
    (the provided manifests give the worker 40 s)."""
    model: str = setting("LONGRUN_MODEL", _model_kind, "scripted, openai or anthropic", "scripted")
    """Model adapter: "scripted" (the run kinds' deterministic scripts), "openai" (Chat Completions, through
    the ``openai`` SDK: OpenAI or a server speaking them) or "anthropic" (Messages, through the ``anthropic``
    SDK). The SDKs make no retry of their own: the runtime's retry policy is the only one."""
    model_url: str = setting("LONGRUN_MODEL_URL", parse.optional_url, "an http(s) URL, or empty", "")
    """Base URL of the provider's API (e.g. ``http://127.0.0.1:8000/v1`` for a local OpenAI-compatible
    server); empty: the provider's own endpoint."""
    model_name: str = setting("LONGRUN_MODEL_NAME", str, "a model name, or empty", "")
    """Model the worker asks for at that API; required with a provider, and priced in ``LONGRUN_MODEL_PRICES``."""
    model_api_key: str = setting("LONGRUN_MODEL_API_KEY", str, "an API key, or empty", "", secret=True)
    """API key for that API, required with a provider (none is built in); keep it in a secret."""
    model_prices: Mapping[str, Price] = setting(
        "LONGRUN_MODEL_PRICES", _prices,
        'a JSON object {"<model>": {"input_per_mtok": <USD>, "output_per_mtok": <USD>}}, or empty', "")
    """US dollars per million input and output tokens, per model: what each call is charged to its run's
    and its tenant's cost budgets, from the tokens the provider reports. The worker refuses to start with
    a provider whose ``LONGRUN_MODEL_NAME`` has no price here, so cost budgets are never silently zero."""
    model_timeout: float = setting("LONGRUN_MODEL_TIMEOUT", parse.positive_float, "seconds, a number > 0", "60")
    """Seconds a model call may take, start to answer (its start-to-close): the SDK's timeout, and a bound
    on the whole call; past it the call is unavailable and the retry policy asks again."""

    def model_problems(self) -> list[Problem]:
        """What keeps the worker from calling its provider (nothing for the scripted model): the settings
        only the worker reads (its API key is mounted in the worker alone), so only it checks them."""
        if self.model not in PROVIDERS:
            return []
        problems: list[Problem] = []
        with_provider = f"with LONGRUN_MODEL={self.model}"
        for name in ("model_name", "model_api_key"):
            if not getattr(self, name).strip():
                declared = declared_variable(WorkerSettings, name)
                problems.append((declared.env, f"missing; expected it {with_provider}"))
        if self.model_name.strip() and self.model_name not in self.model_prices:
            problems.append(("LONGRUN_MODEL_PRICES", f"has no price for LONGRUN_MODEL_NAME {self.model_name!r}; "
                                                     f"expected one {with_provider} (its calls charge cost budgets)"))
        return problems
