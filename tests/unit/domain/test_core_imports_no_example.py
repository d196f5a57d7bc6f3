"""The core (``shared/longrun`` and ``services/``) imports no example: examples are distributions of
their own, reached only through configuration (``longrun.run_kinds``, ``longrun.webhook_providers``).

Every module is parsed with ``ast``; any import of an example's package, of a module under
``examples/``, or of the demo code that lived in the core before, fails the test, naming it.
Relative imports are resolved first, so ``from .demo import forge`` is seen as ``longrun.demo``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.harness import ROOT

CORE = sorted([*(ROOT / "shared" / "longrun").rglob("*.py"), *(ROOT / "services").rglob("*.py")])
EXAMPLE_PACKAGES = sorted(p.parent.name for p in (ROOT / "examples").glob("*/*/__init__.py"))
FORBIDDEN = (*EXAMPLE_PACKAGES, "examples", "longrun.demo", "longrun.workflows.dependency_upgrade")


def package_of(path: Path) -> str:
    """The package a core file's relative imports start from: ``longrun.app`` for shared/longrun/app/x.py."""
    relative = path.parent.relative_to(ROOT / "shared" if path.is_relative_to(ROOT / "shared") else ROOT)
    return ".".join(relative.parts)


def imported(source: str, package: str = "") -> list[str]:
    """Every module an import names, ``from a import b`` as both ``a`` and ``a.b`` (b may be one)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*parts, *([node.module] if node.module else [])])
            names.append(module)
            names.extend(f"{module}.{alias.name}" for alias in node.names)
    return names


def example_imports(source: str, package: str = "") -> list[str]:
    return [name for name in imported(source, package)
            if any(name == f or name.startswith(f"{f}.") for f in FORBIDDEN)]


@pytest.mark.parametrize("path", CORE, ids=[str(p.relative_to(ROOT)) for p in CORE])
def test_core_module_imports_no_example(path: Path) -> None:
    found = example_imports(path.read_text(encoding="utf-8"), package_of(path))
    assert found == [], f"{path.relative_to(ROOT)} imports an example"


def test_the_walk_sees_the_core_and_the_examples() -> None:
    assert "longrun_dependency_upgrade" in EXAMPLE_PACKAGES
    names = {str(p.relative_to(ROOT)) for p in CORE}
    assert {"shared/longrun/app/worker/loop.py", "services/worker/main.py", "shared/longrun/workflows/__init__.py"} <= names


def test_the_check_catches_an_example_import() -> None:
    # What shared/longrun/workflows/__init__.py held before the example moved out
    assert example_imports("from longrun.demo.forge_client import ForgeClient\n"
                           "from longrun.workflows import dependency_upgrade, steps\n"
                           "import longrun_dependency_upgrade.tools\n") == [
        "longrun.demo.forge_client", "longrun.demo.forge_client.ForgeClient", "longrun.workflows.dependency_upgrade",
        "longrun_dependency_upgrade.tools"]
    assert example_imports("from longrun.domain import RunStatus\n") == []


def test_a_relative_import_is_resolved_before_it_is_checked() -> None:
    package = package_of(ROOT / "shared" / "longrun" / "workflows" / "__init__.py")
    assert package == "longrun.workflows"
    assert example_imports("from . import dependency_upgrade\n", package) == ["longrun.workflows.dependency_upgrade"]
    assert example_imports("from ..demo.forge_client import ForgeClient\n", package) == [
        "longrun.demo.forge_client", "longrun.demo.forge_client.ForgeClient"]
    assert example_imports("from . import steps\n", package) == []
