"""The run kinds this deployment can run, and the model adapter they use."""

from __future__ import annotations

from longrun.authoring import Registry, RunKind
from longrun.config import Settings
from longrun.demo.forge_client import ForgeClient
from longrun.domain import PinnedVersions
from longrun.model import ModelAdapter, OpenAICompatibleModel, ScriptedModel
from longrun.workflows import dependency_upgrade, steps
from longrun.workflows.forge_tools import forge_tools

DEPENDENCY_UPGRADE_VERSIONS = PinnedVersions(workflow="1", prompt="upgrade-v1", model_policy="scripted-or-openai-v1",
                                             tool_schemas="forge-v1")
STEPS_VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="bench-v1")


def registry(settings: Settings | None = None) -> Registry:
    """Every run kind at every version this build can run (workers advertise these)."""
    settings = settings or Settings.from_env()
    tools = forge_tools(ForgeClient(settings.forge_url, timeout=settings.tool_timeout),
                        timeout=settings.tool_timeout)
    return Registry([
        RunKind(dependency_upgrade.KIND, DEPENDENCY_UPGRADE_VERSIONS, dependency_upgrade.DependencyUpgrade(), tools,
                dependency_upgrade.allowed_actions),
        RunKind(steps.KIND, STEPS_VERSIONS, steps.Steps(), {steps.ECHO.name: steps.ECHO}),
    ])


def model_adapter(settings: Settings) -> ModelAdapter:
    if settings.model == "openai":
        return OpenAICompatibleModel(settings.model_url, settings.model_api_key, settings.model_name)
    return ScriptedModel(dependency_upgrade.model_script())
