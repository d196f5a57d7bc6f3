"""What the user-facing docs name is what the code has: message versions against the envelope registry,
the events' routing keys against the bus's names, `longrunctl` commands against its click tree, `make`
targets against the Makefile and schema files against `schemas/`. A rename or a new version that the
docs do not follow fails here."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from longrun_client import ctl
from longrun.domain import RunStatus
from longrun.envelope import LATEST
from longrun.envelope.registry import known_versions
from longrun_client.bus import event_key, status_key

ROOT = Path(__file__).resolve().parents[3]
PAGES = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md", ROOT / "DEVELOPERS.md",
                ROOT / "infra" / "README.md", ROOT / "examples" / "node" / "README.md",
                ROOT / "clients" / "python" / "README.md"])
BUS = ROOT / "docs" / "bus.md"
MESSAGE = re.compile(r"`(run\.[a-z_]+)` v(\d+)")
CODE = re.compile(r"`([^`\n]+)`")
FENCED = re.compile(r"```[a-z]*\n(.*?)```", re.DOTALL)


def _code(page: Path) -> list[str]:
    """The page's inline code spans and the lines of its code blocks."""
    text = page.read_text()
    blocks = [line for block in FENCED.findall(text) for line in block.splitlines()]
    return CODE.findall(FENCED.sub("", text)) + blocks


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_message_version_a_page_names_exists(page: Path) -> None:
    named = {(type_, int(version)) for type_, version in MESSAGE.findall(page.read_text())}
    assert {(t, v) for t, v in named if t not in LATEST or v not in known_versions(t)} == set()


def test_the_subscription_table_names_the_versions_the_runtime_sends_on_its_routing_keys() -> None:
    rows = [line for line in BUS.read_text().splitlines() if line.startswith("| `<tenant>.run.")]
    sent = {row.split("|")[1].strip(" `"): MESSAGE.search(row).groups() for row in rows}  # type: ignore[union-attr]
    assert sent == {event_key("<tenant>", "accepted"): ("run.accepted", str(LATEST["run.accepted"])),
                    event_key("<tenant>", "rejected"): ("run.rejected", str(LATEST["run.rejected"])),
                    status_key("<tenant>", "<STATUS>"): ("run.event", str(LATEST["run.event"]))}
    statuses = re.findall(r"`([a-z_]+)`", next(r for r in rows if ".run.status." in r).split("|")[3])
    assert sorted(statuses) == sorted(s.value.lower() for s in RunStatus)


def test_each_messages_section_calls_the_latest_version_current() -> None:
    text = BUS.read_text()
    current = dict(re.findall(r"### `(run\.[a-z_]+)`\n\n\*\*v(\d+)\*\* \(current\)", text))
    assert current == {t: str(v) for t, v in LATEST.items() if t != "run.wakeup"}


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    found = {prefix} if prefix else set()
    for name, command in group.commands.items():
        found |= _commands(command, (*prefix, name)) if isinstance(command, click.Group) else {(*prefix, name)}
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_longrunctl_command_a_page_names_exists(page: Path) -> None:
    known = _commands(ctl.main)
    unknown = []
    for span in _code(page):
        for call in re.findall(r"longrunctl((?: [a-z][a-z-]*)+)", span):
            words = tuple(call.split())
            path = next((words[:n] for n in (2, 1) if words[:n] in known), None)
            if path is None or (path in {(g,) for g, c in ctl.main.commands.items() if isinstance(c, click.Group)}
                                and len(words) > 1):
                unknown.append(" ".join(words))
    assert unknown == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_make_target_and_schema_file_a_page_names_exists(page: Path) -> None:
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    spans = _code(page)
    named = {t for span in spans for t in re.findall(r"(?:^|\s|\()make ([a-z][a-z-]*)", span)}
    schemas = {s for span in spans for s in re.findall(r"schemas/[A-Za-z0-9._-]+", span)}
    assert named - targets == set()
    assert {s for s in schemas if not (ROOT / s).exists()} == set()
