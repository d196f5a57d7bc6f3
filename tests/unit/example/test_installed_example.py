"""The example as every service loads it, by its entry point: its forge URL and timeout are its own
settings (``LONGRUN_FORGE_URL``, ``LONGRUN_FORGE_TIMEOUT``, a malformed one named with what is
expected), and the scripted model answers from the script its run kind brings."""

from __future__ import annotations

import pytest

from longrun import run_kinds
from longrun.config import Settings
from longrun.errors import ConfigError
from longrun.model import ScriptedModel
from longrun.workflows import model_adapter
from longrun_dependency_upgrade import FORGE_TIMEOUT, FORGE_URL, workflow


def test_a_malformed_forge_url_stops_the_load_naming_the_variable_and_what_it_expects(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FORGE_URL, "forge:8090")
    with pytest.raises(ConfigError) as raised:
        run_kinds.load(Settings.from_env({}))
    assert ("LONGRUN_FORGE_URL: expected an http(s) URL such as http://127.0.0.1:8090, got 'forge:8090' "
            "(read by 'longrun_dependency_upgrade:run_kinds', entry point dependency_upgrade") in str(raised.value)


@pytest.mark.parametrize("raw", ["soon", "0", "-3", "inf"])
def test_a_malformed_forge_timeout_stops_the_load_naming_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                                      raw: str) -> None:
    monkeypatch.setenv(FORGE_TIMEOUT, raw)
    with pytest.raises(ConfigError) as raised:
        run_kinds.load(Settings.from_env({}))
    assert f"LONGRUN_FORGE_TIMEOUT: expected seconds, a number > 0, got {raw!r}" in str(raised.value)


def test_the_forge_timeout_bounds_every_forge_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FORGE_TIMEOUT, "3")
    registry = run_kinds.load(Settings.from_env({}))
    kind = registry.newest(workflow.KIND)
    assert {tool.start_to_close for tool in kind.tools.values()} == {3.0}


async def test_the_scripted_model_answers_what_the_example_scripts() -> None:
    settings = Settings.from_env({"LONGRUN_MODEL": "scripted"})
    loaded = model_adapter(settings, run_kinds.load(settings))
    scripted = ScriptedModel(workflow.model_script())
    for stage in workflow.model_script():
        for attempt in range(3):
            context = {"stage": stage, "stage_attempt": attempt}
            assert await loaded.propose(context=context, allowed_actions=["edit_files"]) == \
                await scripted.propose(context=context, allowed_actions=["edit_files"])
