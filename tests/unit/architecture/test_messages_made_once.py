"""Guards that keep each bus message made in one place: no SQL text builds an envelope (a statement
writes data, which ``longrun.bus.wakeup`` or ``longrun.app.effects`` turn into messages), and each
message type the runtime sends is made by one function. Each has a mutant of the real tree it catches."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.unit.architecture.test_guards import ROOT, Mutant

JSON_BUILDERS = re.compile(r"\b(jsonb?_build_object|to_jsonb?|jsonb?_set|format)\s*\(", re.IGNORECASE)
ENVELOPE_ONLY = ("schema_version", "causation_id", "expected_state_version", "data_class", "wakeup_id", "envelope")
"""Envelope fields no stored row of ours has besides an outbox payload (a snapshot keeps a
``schema_version`` too, but no SQL builds one)."""
SENT_TYPES = ("run.wakeup", "run.event", "run.accepted", "run.rejected")
MAKERS = {"run.wakeup": "shared/longrun/bus/wakeup.py", "run.event": "shared/longrun/app/effects.py",
          "run.accepted": "shared/longrun/app/effects.py", "run.rejected": "shared/longrun/app/effects.py"}
"""Where each message type the runtime sends is made."""


def _sources(root: Path) -> list[Path]:
    return sorted(p for top in ("shared", "services") for p in (root / top).rglob("*.py")
                  if "node_modules" not in p.parts)


def _texts(path: Path) -> list[str]:
    """Every string literal of a module (adjacent literals joined, as Python joins them)."""
    return [node.value for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def envelopes_built_in_sql(root: Path) -> list[str]:
    found = []
    for path in _sources(root):
        for text in _texts(path):
            if not JSON_BUILDERS.search(text):
                continue
            named = [f for f in ENVELOPE_ONLY if f"'{f}'" in text]
            if named:
                found.append(f"{path.relative_to(root)}: SQL builds envelope field(s) {named}: {text[:80]!r}")
    return found


def messages_made_elsewhere(root: Path) -> list[str]:
    """A sent message type named as a literal (``make("run.event", ...)``, ``"type": "run.wakeup"``)
    outside the module that makes it; reading one (``== "run.wakeup"``) names it too, so only
    ``make`` calls and dict literals with a ``type`` key count."""
    found = []
    for path in _sources(root):
        where = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            named = None
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "make" \
                    and node.args and isinstance(node.args[0], ast.Constant):
                named = node.args[0].value
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value == "type" and isinstance(value, ast.Constant):
                        named = value.value
            if named in SENT_TYPES and MAKERS[named] != where and not where.startswith("shared/longrun/testing/"):
                found.append(f"{where}:{node.lineno}: makes a {named} outside {MAKERS[named]}")
    return found


GUARDS = {"no SQL builds an envelope": envelopes_built_in_sql, "one maker per message type": messages_made_elsewhere}


@pytest.mark.parametrize("guard", GUARDS)
def test_each_message_is_made_in_one_place(guard: str) -> None:
    assert GUARDS[guard](ROOT) == []


MUTANTS = {
    # The handover's wakeup as it was built before: the sampled envelope with the chosen run spliced in.
    "an envelope spliced in SQL": ("no SQL builds an envelope", Mutant("shared/longrun/db/runs.py", (
        "\n_SPLICED = (\"SELECT t.row -> 'envelope' || jsonb_build_object('run_id', handed.run_id, "
        "'expected_state_version', handed.revision) FROM handed\")\n"))),
    "a wakeup made by a service": ("one maker per message type", Mutant("services/scheduler/admitting.py", (
        "\n\ndef _stray(make):\n    return make(\"run.wakeup\", {\"reason\": \"stray\"})\n"))),
    "a broadcast written as a dict": ("one maker per message type", Mutant("shared/longrun/app/timer/firing.py", (
        "\n_STRAY = {\"type\": \"run.event\", \"payload\": {}}\n"))),
}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_each_guard_catches_its_mutant(mutant: str, tmp_path: Path) -> None:
    guard, change = MUTANTS[mutant]
    assert GUARDS[guard](change.applied(tmp_path)) != []
