"""The run kind that ships with longrun, and the model adapter run kinds use."""

from __future__ import annotations

from longrun.authoring import Registry, RunKind
from longrun.config import Settings
from longrun.domain import PinnedVersions
from longrun.model import ModelAdapter, OpenAICompatibleModel, ScriptedModel
from longrun.workflows import steps

STEPS_VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="bench-v1")


def builtin(settings: Settings) -> list[RunKind]:
    """``LONGRUN_RUN_KINDS``' default: the benchmark's ``steps`` (K echo steps, then complete).
    Agents come from their own packages (``longrun.run_kinds`` entry points or this variable)."""
    return [RunKind(steps.KIND, STEPS_VERSIONS, steps.Steps(), {steps.ECHO.name: steps.ECHO},
                    input_schema=steps.StepsInput)]


def model_adapter(settings: Settings, kinds: Registry) -> ModelAdapter:
    """``LONGRUN_MODEL``: an OpenAI-compatible endpoint, or the scripts the run kinds bring."""
    if settings.model == "openai":
        # Under a token limit each call says how much of its answer it reserved.
        max_tokens = settings.model_max_tokens if settings.model_tokens_per_period else None
        return OpenAICompatibleModel(settings.model_url, settings.model_api_key, settings.model_name,
                                     max_tokens=max_tokens)
    return ScriptedModel(kinds.model_script())
