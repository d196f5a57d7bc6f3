"""The example as every service loads it, by its entry point: its forge URL is its own setting
(``LONGRUN_FORGE_URL``, a malformed one named with what is expected), and the scripted model answers
from the script its run kind brings."""

from __future__ import annotations

import pytest

from longrun import run_kinds
from longrun.config import Settings
from longrun.errors import ConfigError
from longrun.model import ScriptedModel
from longrun.workflows import model_adapter
from longrun_dependency_upgrade import FORGE_URL, workflow


def test_a_malformed_forge_url_stops_the_load_naming_the_variable_and_what_it_expects(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FORGE_URL, "forge:8090")
    with pytest.raises(ConfigError) as raised:
        run_kinds.load(Settings.from_env({}))
    assert ("LONGRUN_FORGE_URL: expected an http(s) URL such as http://127.0.0.1:8090, got 'forge:8090' "
            "(read by 'longrun_dependency_upgrade:run_kinds', entry point dependency_upgrade") in str(raised.value)


async def test_the_scripted_model_answers_what_the_example_scripts() -> None:
    settings = Settings.from_env({"LONGRUN_MODEL": "scripted"})
    loaded = model_adapter(settings, run_kinds.load(settings))
    scripted = ScriptedModel(workflow.model_script())
    for stage in workflow.model_script():
        for attempt in range(3):
            context = {"stage": stage, "stage_attempt": attempt}
            assert await loaded.propose(context=context, allowed_actions=["edit_files"]) == \
                await scripted.propose(context=context, allowed_actions=["edit_files"])
