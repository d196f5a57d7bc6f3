"""Run kinds come from configuration (``LONGRUN_RUN_KINDS``) and installed entry points; a bad
reference stops the process naming where it came from, the reference and why."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from longrun import run_kinds
from longrun.authoring import Registry
from longrun.config import Settings
from longrun.errors import ConfigError
from longrun.workflows import builtin

KINDS_MODULE = '''
from longrun.authoring import RunKind
from longrun.domain import PinnedVersions
from longrun.workflows.steps import ECHO, Steps

def _kind(name, version="1"):
    return RunKind(name, PinnedVersions(workflow=version, prompt="p1", model_policy="m1", tool_schemas="t1"),
                   Steps(), {ECHO.name: ECHO})

ONE = _kind("one")
MANY = [_kind("two"), _kind("two", "10"), _kind("two", "9")]
NOT_A_KIND = 42
BAD_VERSION = _kind("three", "latest")

def from_settings(settings):
    return _kind("four", "2") if settings.worker_concurrency > 0 else []

def failing(settings):
    raise RuntimeError("the forge URL is required")
'''


@pytest.fixture
def author(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An author's package in a directory of its own, importable as ``acme_kinds``."""
    package = tmp_path / "acme_kinds"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(KINDS_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "acme_kinds"
    sys.modules.pop("acme_kinds", None)


def settings(kinds: str) -> Settings:
    return Settings.from_env({"LONGRUN_RUN_KINDS": kinds})


EXAMPLE = "dependency_upgrade"
"""The example agent, installed in the test environment: its entry point adds it to every load."""


def authored(registry: Registry) -> list[tuple[str, str]]:
    return [(name, version) for name, version in registry.advertised() if name != EXAMPLE]


def test_the_default_is_the_benchmark_kind_and_installed_packages_add_theirs() -> None:
    assert Registry(builtin(Settings.from_env({}))).advertised() == [("steps", "1")]
    registry = run_kinds.load(Settings.from_env({}))
    assert {name for name, _ in registry.advertised()} == {"steps", EXAMPLE}


def test_references_name_a_kind_a_sequence_or_a_function_of_the_settings(author: str) -> None:
    registry = run_kinds.load(settings(f"{author}:ONE, {author}:MANY,{author}:from_settings"))
    assert authored(registry) == [("four", "2"), ("one", "1"), ("two", "1"), ("two", "10"), ("two", "9")]
    assert registry.newest("two").versions.workflow == "10"


@pytest.mark.parametrize(("reference", "why"), [
    ("acme_kinds", "'acme_kinds' is not package.module:attribute"),
    ("acme_missing:KINDS", "'acme_missing:KINDS': cannot import acme_missing: ModuleNotFoundError"),
    ("acme_kinds:NOTHING", "'acme_kinds:NOTHING': acme_kinds has no attribute 'NOTHING'"),
    ("acme_kinds:NOT_A_KIND", "'acme_kinds:NOT_A_KIND' is neither a RunKind nor a sequence of them"),
    ("acme_kinds:failing", "'acme_kinds:failing' failed to build its run kinds: RuntimeError"),
    ("acme_kinds:BAD_VERSION", "workflow version 'latest' is not a version"),
])
def test_a_bad_reference_names_the_variable_the_reference_and_why(author: str, reference: str, why: str) -> None:
    with pytest.raises(ConfigError) as raised:
        run_kinds.load(settings(reference))
    assert "LONGRUN_RUN_KINDS" in str(raised.value) and why in str(raised.value)


def test_no_run_kinds_at_all_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_kinds, "entry_points", lambda group: [])  # no distribution brings any
    with pytest.raises(ConfigError, match="LONGRUN_RUN_KINDS: no run kinds"):
        run_kinds.load(settings(""))


def test_an_installed_distribution_brings_its_kinds_by_entry_point(author: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "acme_kinds-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-kinds\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{run_kinds.ENTRY_POINT_GROUP}]\nacme = acme_kinds:MANY\n"
                                           "broken = acme_kinds:NOTHING\n")
    with pytest.raises(ConfigError) as raised:
        run_kinds.load(settings(f"{author}:ONE"))
    assert "entry point broken (longrun.run_kinds) of acme-kinds" in str(raised.value)
    (info / "entry_points.txt").write_text(f"[{run_kinds.ENTRY_POINT_GROUP}]\nacme = acme_kinds:MANY\n")
    registry = run_kinds.load(settings(f"{author}:ONE"))
    assert authored(registry) == [("one", "1"), ("two", "1"), ("two", "10"), ("two", "9")]
