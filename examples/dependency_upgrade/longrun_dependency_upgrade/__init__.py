"""An example agent for longrun, in a distribution of its own: it upgrades a dependency on a code
forge, waits for CI by webhook, asks for the approval of the exact merge request, and opens it.

Installed, it brings its run kind (``longrun.run_kinds`` entry point ``dependency_upgrade``) and
the forge's webhook provider (``longrun.webhook_providers`` entry point ``forge``) to every longrun
service; ``forge`` is a stand-in forge with CI for demos and tests, and ``demo`` is ``make run``.
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

from longrun.authoring import RunKind
from longrun.config import Settings
from longrun.domain import PinnedVersions, Scope
from longrun.errors import ConfigError
from longrun_dependency_upgrade import workflow
from longrun_dependency_upgrade.forge_client import ForgeClient
from longrun_dependency_upgrade.tools import forge_tools

FORGE_URL = "LONGRUN_FORGE_URL"
DEFAULT_FORGE_URL = "http://127.0.0.1:8090"
VERSIONS = PinnedVersions(workflow="1", prompt="upgrade-v1", model_policy="scripted-or-openai-v1",
                          tool_schemas="forge-v1")


SCOPE = Scope(tools=("forge.*",), resources=("repo:*",))
"""The most a run may do: the forge's operations on any repository. A tenant's policy (e.g. only
``repo:acme/*``) and the producer's ``scope`` narrow it per run."""


def forge_url() -> str:
    """``LONGRUN_FORGE_URL``: the forge and CI the agent works on."""
    url = os.environ.get(FORGE_URL, DEFAULT_FORGE_URL)
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError([(FORGE_URL, f"expected an http(s) URL such as {DEFAULT_FORGE_URL}, got {url!r}")])
    return url


def run_kinds(settings: Settings) -> list[RunKind]:
    """The agent at version 1, its forge tools calling ``LONGRUN_FORGE_URL``."""
    tools = forge_tools(ForgeClient(forge_url(), timeout=settings.tool_timeout), timeout=settings.tool_timeout)
    return [RunKind(workflow.KIND, VERSIONS, workflow.DependencyUpgrade(), tools, workflow.allowed_actions,
                    model_script=workflow.model_script(), scope=SCOPE)]
