"""How longrunctl shows an answer: a table for people (the default), JSON or YAML for scripts.

JSON and YAML print the gateway's answer as it came, less what a terminal would act on
(``printable``). A table shows the rows of a list (a page of
runs, the audit log) in the columns a ``View`` names, or any other answer as ``key: value`` lines,
nested values on one line, long ones cut.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

FORMATS = ("table", "json", "yaml")
CELL = 48
"""Widest a table cell or a nested value gets before it is cut."""
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"                # CSI: cursor moves, colours, erasing
    r"|\x1b[]PX^_].*?(?:\x07|\x1b\\|\x9c|$)"  # OSC, DCS, SOS, PM, APC: titles, hyperlinks, clipboard
    r"|\x9b[0-?]*[ -/]*[@-~]"                 # the 8-bit CSI
    r"|\x1b[ -/]*[0-~]?",                     # any other escape
    re.DOTALL)
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""C0 and C1 control characters but tab and newline, and the bidirectional overrides that reorder
what a line appears to say."""


@dataclass(frozen=True)
class View:
    """Which rows of an answer a table shows, in which columns (header, key; ``a.b`` reaches into ``a``)."""

    columns: tuple[tuple[str, str], ...]
    rows: Callable[[Any], Sequence[Mapping[str, Any]]] = lambda data: data
    footer: Callable[[Any], str | None] = field(default=lambda data: None)


def printable(value: Any) -> Any:
    """``value`` (an answer from the gateway: JSON) with every string, keys included, stripped of
    terminal escape sequences and other control characters, so nothing the server relays (a run's
    input, a reason, an error) can move the cursor, retitle the window or hide a line."""
    if isinstance(value, str):
        return _CONTROLS.sub("", _ESCAPES.sub("", value))
    if isinstance(value, Mapping):
        return {printable(k): printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable(v) for v in value]
    return value


def render(data: Any, fmt: str, view: View | None = None) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, sort_keys=True)
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=True, allow_unicode=True).rstrip("\n")
    if view is not None:
        lines = [table(view.rows(data), view.columns)]
        footer = view.footer(data)
        return "\n".join([*lines, footer] if footer else lines)
    if isinstance(data, list) and all(isinstance(row, Mapping) for row in data):
        keys = tuple(dict.fromkeys(k for row in data for k in row))
        return table(data, tuple((k.upper(), k) for k in keys))
    if isinstance(data, Mapping):
        return fields(data)
    return cell(data)


def table(rows: Sequence[Mapping[str, Any]], columns: tuple[tuple[str, str], ...]) -> str:
    if not rows:
        return "(none)"
    cells = [[cell(reach(row, key)) for _, key in columns] for row in rows]
    widths = [max(len(header), *(len(r[i]) for r in cells)) for i, (header, _) in enumerate(columns)]
    lines = [[header for header, _ in columns], *cells]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def fields(data: Mapping[str, Any], indent: str = "") -> str:
    width = max((len(k) for k in data), default=0)
    return "\n".join(f"{indent}{k.ljust(width)}  {cell(v, width=CELL * 2)}" for k, v in data.items())


def reach(row: Mapping[str, Any], key: str) -> Any:
    value: Any = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def cell(value: Any, width: int = CELL) -> str:
    if value is None:
        return "-"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 1] + "…"
