"""The run kind that ships with longrun, and the model adapter run kinds use."""

from __future__ import annotations

from longrun.authoring import Registry, RunKind
from longrun.config import Settings
from longrun.domain import PinnedVersions
from longrun.errors import ConfigError
from longrun.model import ModelAdapter, ScriptedModel
from longrun.workflows import steps

STEPS_VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="bench-v1")


def builtin(settings: Settings) -> list[RunKind]:
    """``LONGRUN_RUN_KINDS``' default: the benchmark's ``steps`` (K echo steps, then complete).
    Agents come from their own packages (``longrun.run_kinds`` entry points or this variable)."""
    return [RunKind(steps.KIND, STEPS_VERSIONS, steps.Steps(), {steps.ECHO.name: steps.ECHO},
                    input_schema=steps.StepsInput)]


def model_adapter(settings: Settings, kinds: Registry) -> ModelAdapter:
    """``LONGRUN_MODEL``: a provider through its SDK, or the scripts the run kinds bring; ``ConfigError``
    when the provider's name, key or price is missing."""
    problems = settings.model_problems()
    if problems:
        raise ConfigError(problems)
    if settings.model == "scripted":
        return ScriptedModel(kinds.model_script())
    # A provider's SDK is imported only where it is chosen: importing both costs every service
    # (each loads this module for its run kinds) seconds at start.
    base_url, price = settings.model_url or None, settings.model_prices[settings.model_name]
    if settings.model == "anthropic":
        from longrun.model_anthropic import AnthropicModel

        return AnthropicModel(base_url=base_url, api_key=settings.model_api_key, model=settings.model_name,
                              price=price, timeout=settings.model_timeout, max_tokens=settings.model_max_tokens)
    # Under a token limit each call says how much of its answer it reserved.
    max_tokens = settings.model_max_tokens if settings.model_tokens_per_period else None
    from longrun.model_openai import OpenAIModel

    return OpenAIModel(base_url=base_url, api_key=settings.model_api_key, model=settings.model_name, price=price,
                       timeout=settings.model_timeout, max_tokens=max_tokens)
