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


def builtin(settings: Settings) -> list[RunKind]:
    """The run kinds that ship with longrun (``LONGRUN_RUN_KINDS``' default): the dependency-upgrade
    agent and the benchmark's ``steps``."""
    tools = forge_tools(ForgeClient(settings.forge_url, timeout=settings.tool_timeout),
                        timeout=settings.tool_timeout)
    return [
        RunKind(dependency_upgrade.KIND, DEPENDENCY_UPGRADE_VERSIONS, dependency_upgrade.DependencyUpgrade(), tools,
                dependency_upgrade.allowed_actions),
        RunKind(steps.KIND, STEPS_VERSIONS, steps.Steps(), {steps.ECHO.name: steps.ECHO}),
    ]


def registry(settings: Settings | None = None) -> Registry:
    """The built-in run kinds, for tests and tools that do not read ``LONGRUN_RUN_KINDS``."""
    return Registry(builtin(settings or Settings.from_env()))


def model_adapter(settings: Settings) -> ModelAdapter:
    if settings.model == "openai":
        return OpenAICompatibleModel(settings.model_url, settings.model_api_key, settings.model_name)
    return ScriptedModel(dependency_upgrade.model_script())
