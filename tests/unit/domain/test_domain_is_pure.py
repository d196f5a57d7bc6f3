"""The domain imports only the standard-library modules it needs, longrun.errors, and itself.

No I/O, clocks, randomness or framework can creep in: every module of longrun.domain is
parsed with ``ast`` and each import is checked against an allow-list.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import longrun.domain

ALLOWED = {
    "__future__", "dataclasses", "enum", "typing", "collections.abc", "hashlib", "json", "math",
    "types", "functools", "operator", "longrun.errors",
}  # fmt: skip
DOMAIN_DIR = Path(longrun.domain.__file__).parent
MODULES = sorted(DOMAIN_DIR.glob("*.py"))


def imported(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports hide what is imported"
            names.append(node.module or "")
    return names


def allowed(name: str) -> bool:
    return name in ALLOWED or name == "longrun.domain" or name.startswith("longrun.domain.")


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_domain_module_imports_only_the_allow_list(path: Path) -> None:
    forbidden = [name for name in imported(ast.parse(path.read_text(encoding="utf-8"))) if not allowed(name)]
    assert forbidden == [], f"{path.name} imports {forbidden}"


def test_the_walk_sees_every_module() -> None:
    assert {p.stem for p in MODULES} >= {
        "__init__", "action", "budget", "codec", "context", "decisions", "events", "evolve",
        "invariants", "lease", "ledger", "lifecycle", "retry", "run", "snapshot",
    }  # fmt: skip


def test_the_check_catches_a_forbidden_import() -> None:
    assert not all(allowed(n) for n in imported(ast.parse("import os\nfrom time import monotonic\n")))
