"""An example agent for longrun, in a distribution of its own: it upgrades a dependency on a code
forge, waits for CI by webhook, asks for the approval of the exact merge request, and opens it.

Installed, it brings its run kind (``longrun.run_kinds`` entry point ``dependency_upgrade``) and
the forge's webhook provider (``longrun.webhook_providers`` entry point ``forge``) to every longrun
service; ``forge`` is a demo forge for demos and tests (real git repositories, CI that runs their
tests), and ``demo`` is ``make run``.
"""

from __future__ import annotations

import dataclasses
import os
from urllib.parse import urlparse

from longrun.authoring import RunKind
from longrun.config import Settings
from longrun.domain import PinnedVersions, Scope
from longrun.errors import ConfigError
from longrun_dependency_upgrade import workflow, workflow_code_first
from longrun_dependency_upgrade.forge_client import ForgeClient
from longrun_dependency_upgrade.tools import forge_tools

FORGE_URL = "LONGRUN_FORGE_URL"
DEFAULT_FORGE_URL = "http://127.0.0.1:8090"
FORGE_TIMEOUT = "LONGRUN_FORGE_TIMEOUT"
DEFAULT_FORGE_TIMEOUT = "10"
VERSIONS = PinnedVersions(workflow="1", prompt="upgrade-v1", model_policy="scripted-or-openai-v1",
                          tool_schemas="forge-v1")
CODE_FIRST_VERSIONS = dataclasses.replace(VERSIONS, workflow="2")
"""Version 2: the same agent written code-first (``workflow_code_first``); runs started on 1 finish on 1."""


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


def forge_timeout() -> float:
    """``LONGRUN_FORGE_TIMEOUT``: seconds a forge call may take (its start-to-close timeout); past it
    the call's outcome is unknown, never failed."""
    raw = os.environ.get(FORGE_TIMEOUT, DEFAULT_FORGE_TIMEOUT)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise ConfigError([(FORGE_TIMEOUT, f"expected seconds, a number > 0, got {raw!r}")])
    return seconds


def run_kinds(settings: Settings) -> list[RunKind]:
    """The agent at version 1 (decide-style) and 2 (code-first, which new runs pin), its forge tools calling
    ``LONGRUN_FORGE_URL`` within ``LONGRUN_FORGE_TIMEOUT``."""
    timeout = forge_timeout()
    tools = forge_tools(ForgeClient(forge_url(), timeout=timeout), timeout=timeout)
    return [RunKind(workflow.KIND, VERSIONS, workflow.DependencyUpgrade(), tools, workflow.allowed_actions,
                    model_script=workflow.model_script(), scope=SCOPE),
            RunKind(workflow.KIND, CODE_FIRST_VERSIONS, workflow_code_first.upgrade, tools, workflow.allowed_actions,
                    model_script=workflow.model_script(), scope=SCOPE, input_schema=workflow_code_first.UpgradeInput)]
