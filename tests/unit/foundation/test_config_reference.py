"""docs/configuration.md: generated from Settings, naming every setting, and current."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from longrun import config_reference
from longrun.config import Settings, declared_fields

ROOT = Path(__file__).resolve().parents[3]
DOCUMENT = ROOT / "docs" / "configuration.md"


def test_the_committed_reference_matches_the_settings() -> None:
    assert DOCUMENT.exists(), "docs/configuration.md is missing; run `make schemas`"
    assert DOCUMENT.read_text() == config_reference.render(), (
        "docs/configuration.md drifted from shared/longrun/config/; run `make schemas`")


def test_rendering_is_deterministic() -> None:
    assert config_reference.render() == config_reference.render()


def test_every_setting_has_a_variable_and_a_description() -> None:
    problems = config_reference.problems()
    assert problems == [], "\n".join(problems)


def test_every_setting_appears_with_its_variable_default_and_description() -> None:
    text = config_reference.render()
    for setting in config_reference.settings():
        assert f"### `{setting.env}`" in text, f"{setting.env} ({setting.field}) is missing from the reference"
        assert f"`Settings.{setting.field}`" in text
        assert config_reference._markdown(setting.doc) in text
    assert [s.field for s in config_reference.settings()] == [f.name for f in declared_fields()]
    assert {f.name for f in declared_fields()} == {f.name for f in fields(Settings)}
    assert set(Settings.variables()) == {s.env for s in config_reference.settings()} | {
        f"{s.env}_FILE" for s in config_reference.settings() if s.secret}
    for secret in (s for s in config_reference.settings() if s.secret):
        assert f"the file `{secret.env}_FILE` names" in text


def test_a_default_computed_per_process_is_written_as_what_it_is_made_of() -> None:
    (instance,) = [s for s in config_reference.settings() if s.field == "instance_id"]
    assert instance.default == "<hostname>-<pid>"


def test_a_setting_without_a_docstring_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    documented = config_reference.docstrings()
    monkeypatch.setattr(config_reference, "docstrings", lambda: {k: v for k, v in documented.items()
                                                                 if k != "partitions"})
    assert config_reference.problems() == [
        "Settings.partitions has no docstring: write one under the field in shared/longrun/config/process.py"]
    with pytest.raises(ValueError, match="Settings.partitions has no docstring"):
        config_reference.render()


def test_a_setting_without_a_variable_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    declared = config_reference.variable
    monkeypatch.setattr(config_reference, "variable", lambda f: None if f.name == "tenant_slots" else declared(f))
    assert config_reference.problems() == [
        "Settings.tenant_slots has no LONGRUN_* variable: declare it with setting() in "
        "shared/longrun/config/admission.py"]
