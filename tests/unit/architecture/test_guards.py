"""Guards that keep the code's shape: no import cycle in ``shared/longrun``, no module over 500 lines
and no service entrypoint over 150, the use-case packages free of drivers and of the PostgreSQL
adapters, and the adapters and ports free of use cases. Each guard is a function of a source tree;
each has a mutant of the real tree it must catch, so a guard that stopped looking fails too."""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.unit.architecture.imports import cycles, graph, modules, reaches

ROOT = Path(__file__).resolve().parents[3]
MODULE_LINES = 500
ENTRYPOINT_LINES = 150
ENTRYPOINTS = ("main.py", "__main__.py")
USE_CASE_PACKAGES = ("longrun.app.worker", "longrun.app.gateway", "longrun.app.scheduler", "longrun.app.timer",
                     "longrun.app.reconciler")
"""The use cases grouped by the service that runs them: pure of I/O drivers, they reach storage and the
bus through the ports (``longrun.ports``). Pure means nothing they import, directly or not, imports a
driver."""
SHARED_USE_CASE_MODULES = ("longrun.app.effects", "longrun.app.questions", "longrun.app.signals",
                           "longrun.app.tool_permits", "longrun.app.wait_notices")
"""What several services' use cases share (the messages a transition sends, a question's answer check,
a signal sent over the operator API or the ingress, the wake a freed tool permit gives, the notices a
wait for a person sends):
as pure as the packages."""
DRIVERS = ("sqlalchemy", "psycopg", "aio_pika", "aiormq", "longrun.db")


def import_cycles(root: Path) -> list[str]:
    return [" <-> ".join(cycle) for cycle in cycles(graph(root / "shared", "longrun"))]


def oversized(root: Path) -> list[str]:
    found = []
    for path in sorted([*(root / "shared").rglob("*.py"), *(root / "services").rglob("*.py")]):
        if "node_modules" in path.parts:
            continue
        lines = len(path.read_text().splitlines())
        entrypoint = path.parent.parent == root / "services" and path.name in ENTRYPOINTS
        limit = ENTRYPOINT_LINES if entrypoint else MODULE_LINES
        if lines > limit:
            found.append(f"{path.relative_to(root)}: {lines} lines (at most {limit})")
    return found


def impure_use_cases(root: Path) -> list[str]:
    known = modules(root / "shared", "longrun")
    found: list[str] = []
    checked: list[str] = []
    for package in USE_CASE_PACKAGES:
        members = [name for name in known if name == package or name.startswith(package + ".")]
        if len(members) <= 1:
            found.append(f"{package}: no such package, or it holds no module")
        checked.extend(members)
    for module in SHARED_USE_CASE_MODULES:
        if module not in known:
            found.append(f"{module}: no such module")
        else:
            checked.append(module)
    found += [f"{name}: in none of the use-case packages, nor a shared use-case module" for name in sorted(known)
              if name.startswith("longrun.app.") and name not in checked]
    edges = graph(root / "shared", "longrun")
    imports: dict[str, list[str]] = {}  # each module parsed once: the use cases reach many of the same modules
    for name in checked:
        for module in [name, *sorted(reaches(edges, name))]:
            if module not in imports:
                imports[module] = sorted(_imports(known[module]))
            for imported in imports[module]:
                if any(imported == d or imported.startswith(d + ".") for d in DRIVERS):
                    via = "" if module == name else f" through {module}"
                    found.append(f"{name} imports {imported}{via}")
    return found


ADAPTERS_AND_PORTS = ("longrun.db", "longrun.ports")
"""The PostgreSQL adapters and the ports: use cases call them, never the other way round (a use case a
store needs, such as matching a kept webhook event, is handed to it by its service)."""


def adapters_calling_use_cases(root: Path) -> list[str]:
    known = modules(root / "shared", "longrun")
    found = []
    for name in sorted(known):
        if not any(name == p or name.startswith(p + ".") for p in ADAPTERS_AND_PORTS):
            continue
        for imported in sorted(_imports(known[name])):
            if imported == "longrun.app" or imported.startswith("longrun.app."):
                found.append(f"{name} imports {imported}")
    return found


def _imports(path: Path) -> set[str]:
    """The absolute names a module imports (``from a import b``: ``a`` and ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.update({node.module, *(f"{node.module}.{alias.name}" for alias in node.names)})
    return names


GUARDS = {"import cycles": import_cycles, "module size": oversized, "use-case purity": impure_use_cases,
          "adapters below use cases": adapters_calling_use_cases}


@pytest.mark.parametrize("guard", GUARDS)
def test_the_tree_keeps_its_shape(guard: str) -> None:
    assert GUARDS[guard](ROOT) == []


@dataclass(frozen=True)
class Mutant:
    """One file of the real tree changed: ``text`` appended to it (a file that is not there is made)."""

    path: str
    text: str

    def applied(self, tmp: Path) -> Path:
        for top in ("shared", "services"):
            shutil.copytree(ROOT / top, tmp / top, ignore=shutil.ignore_patterns("node_modules", "__pycache__"))
        target = tmp / self.path
        target.write_text((target.read_text() if target.exists() else "") + self.text)
        return tmp


MUTANTS = {
    "a cycle through the ports": ("import cycles", Mutant("shared/longrun/ports/runs.py",
                                                          "\nfrom longrun.app.worker import commit\n")),
    "a module over 500 lines": ("module size", Mutant("shared/longrun/app/worker/rounds.py", "\n" * MODULE_LINES)),
    "an entrypoint over 150 lines": ("module size", Mutant("services/worker/main.py", "\n" * ENTRYPOINT_LINES)),
    "a use case reaching an adapter": ("use-case purity", Mutant("shared/longrun/app/worker/commit.py",
                                                                 "\nfrom longrun.db import runs\n")),
    "a use case importing a driver": ("use-case purity", Mutant("shared/longrun/app/worker/rounds.py",
                                                                "\nimport sqlalchemy\n")),
    "a use case reaching a driver through what it imports": ("use-case purity", Mutant(
        "shared/longrun/authoring.py", "\nimport psycopg\n")),
    "a use case outside the packages": ("use-case purity", Mutant("shared/longrun/app/stray.py",
                                                                 '"""A use case beside the packages."""\n')),
    "a gateway use case importing the bus client": ("use-case purity", Mutant(
        "shared/longrun/app/gateway/operate.py", "\nimport aio_pika\n")),
    "a store calling a use case": ("adapters below use cases", Mutant(
        "shared/longrun/db/worker_store.py", "\nfrom longrun.app.gateway import webhooks\n")),
    "a shared use case reaching an adapter": ("use-case purity", Mutant("shared/longrun/app/effects.py",
                                                                       "\nfrom longrun.db import outbox\n")),
}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_each_guard_catches_its_mutant(mutant: str, tmp_path: Path) -> None:
    guard, change = MUTANTS[mutant]
    assert GUARDS[guard](change.applied(tmp_path)) != []


def test_a_listed_use_case_package_that_is_gone_fails_the_purity_guard(tmp_path: Path) -> None:
    tree = Mutant("shared/longrun/app/gateway/__init__.py", "").applied(tmp_path)
    shutil.rmtree(tree / "shared/longrun/app/gateway")
    assert impure_use_cases(tree) == ["longrun.app.gateway: no such package, or it holds no module"]
