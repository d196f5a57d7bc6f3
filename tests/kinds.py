"""The run kinds the tests' services load: ``LONGRUN_RUN_KINDS``' default (the benchmark's ``steps``)
and the installed example's ``dependency_upgrade`` (its entry point)."""

from __future__ import annotations

from longrun import run_kinds
from longrun.authoring import Registry
from longrun.config import Settings


def registry(settings: Settings | None = None) -> Registry:
    return run_kinds.load(settings or Settings.from_env({}))
