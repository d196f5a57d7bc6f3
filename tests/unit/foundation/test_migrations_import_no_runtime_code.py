"""A migration imports no runtime code: it runs against every database still at an old revision,
so what it does must not change when the runtime does (0013 once loaded the webhook providers, and
through them the use cases). Only the standard library, Alembic and SQLAlchemy are allowed."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT

MIGRATIONS = sorted((ROOT / "shared" / "longrun" / "db" / "migrations" / "versions").glob("*.py"))
ALLOWED = {"__future__", "alembic", "sqlalchemy"} | set(sys.stdlib_module_names)


def foreign_imports(source: str) -> list[str]:
    """Modules imported (at any depth, functions included) from outside the standard library,
    Alembic and SQLAlchemy."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.append("." * node.level + (node.module or ""))
    return [name for name in names if name.split(".")[0] not in ALLOWED]


@pytest.mark.parametrize("path", MIGRATIONS, ids=[p.name for p in MIGRATIONS])
def test_a_migration_imports_no_runtime_code(path: Path) -> None:
    assert foreign_imports(path.read_text(encoding="utf-8")) == [], f"{path.name} imports runtime code"


def test_the_walk_sees_every_migration() -> None:
    assert len(MIGRATIONS) >= 20 and any(p.name.startswith("0013_") for p in MIGRATIONS)


def test_the_check_catches_an_import_inside_a_function() -> None:
    # What 0013 held before it carried its own translation
    assert foreign_imports("import json\nimport sqlalchemy as sa\nfrom alembic import op\n"
                           "def upgrade():\n    from longrun import webhook_providers\n"
                           "    from longrun.config import Settings\n    from . import helpers\n") == [
        "longrun", "longrun.config", "."]
