"""The import graph of a source tree, read from its files (nothing is imported): which module imports
which, and the cycles in it."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``root`` (the folder holding the package), by dotted name."""
    found = {}
    for path in sorted((root / package.replace(".", "/")).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imported(path: Path, name: str, known: Mapping[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` (at ``path``) imports: ``from a import b`` names
    ``a.b`` when that is a module, else ``a``; relative imports are resolved."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, name, is_package)
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                targets.add(sub if sub in known else base)
    return {_known(t, known) for t in targets if _known(t, known) is not None} - {name}  # type: ignore[misc]


def graph(root: Path, package: str) -> dict[str, set[str]]:
    known = modules(root, package)
    return {name: imported(path, name, known) for name, path in known.items()}


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def reaches(edges: Mapping[str, set[str]], start: str) -> Iterator[str]:
    """Every module ``start`` imports, directly or not."""
    seen, todo = {start}, [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
                yield nxt


def _absolute(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    parts = name.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _known(target: str, known: Mapping[str, Path]) -> str | None:
    """``target`` or the closest package of it that is a known module."""
    parts = target.split(".")
    while parts:
        name = ".".join(parts)
        if name in known:
            return name
        parts.pop()
    return None
