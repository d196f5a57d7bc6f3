"""What the user-facing docs name is what the code has: message versions against the envelope registry,
the events' routing keys against the bus's names, `longrunctl` commands against its click tree, `make`
targets against the Makefile and schema files against `schemas/`. A rename or a new version that the
docs do not follow fails here."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import click
import pytest

from longrun_client import ctl
from longrun.domain import RunStatus
from longrun.envelope import LATEST, PAYLOADS
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


ROUTING_KEY = re.compile(r"(?<![\w.])([A-Za-z0-9_*#<>-]+)\.run\.([A-Za-z0-9_.*#<>-]+)")
STATUS_PLACEHOLDERS = {"<status>", "<STATUS>", "*", "#"}
_NOTICE = PAYLOADS[("run.notice", LATEST["run.notice"])].model_fields
NOTICE_KEYS = {f"notice.{kind}.{notice}"
               for kind in {*typing.get_args(_NOTICE["wait_kind"].annotation), "<wait_kind>", "*"}
               for notice in {*typing.get_args(_NOTICE["notice"].annotation), "<notice>", "*"}} | {"notice.#"}
"""The ``run.notice`` keys (``<tenant>.run.notice.<wait_kind>.<notice>``) and the bindings that can mean them."""


def _code(text: str) -> list[str]:
    """The text's inline code spans and the lines of its code blocks."""
    blocks = [line for block in FENCED.findall(text) for line in block.splitlines()]
    return CODE.findall(FENCED.sub("", text)) + blocks


def unknown_versions(text: str) -> set[tuple[str, int]]:
    """Each `run.x` vN the text names that the envelope registry does not know."""
    named = {(type_, int(version)) for type_, version in MESSAGE.findall(text)}
    return {(t, v) for t, v in named if t not in LATEST or v not in known_versions(t)}


def unknown_routing_keys(text: str) -> list[str]:
    """Each `<tenant>.run.…` key in the text's code that the runtime never publishes on nor a binding can mean."""
    statuses = {s.value.lower() for s in RunStatus} | STATUS_PLACEHOLDERS
    unknown = []
    for span in _code(text):
        for tenant, rest in ROUTING_KEY.findall(span):
            event, _, status = rest.partition(".")
            sent = event_key(tenant, rest) in {event_key(tenant, "accepted"), event_key(tenant, "rejected")} or \
                (event == "status" and status in statuses) or rest in NOTICE_KEYS
            if not (sent or rest in {"#", "*", "status.#"}):
                unknown.append(f"{tenant}.run.{rest}")
    return unknown


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    found = {prefix} if prefix else set()
    for name, command in group.commands.items():
        found |= _commands(command, (*prefix, name)) if isinstance(command, click.Group) else {(*prefix, name)}
    return found


def unknown_commands(text: str) -> list[str]:
    """Each `longrunctl …` call in the text's code that its click tree does not have."""
    known = _commands(ctl.main)
    groups = {(g,) for g, c in ctl.main.commands.items() if isinstance(c, click.Group)}
    unknown = []
    for span in _code(text):
        for call in re.findall(r"longrunctl((?: [a-z][a-z-]*)+)", span):
            words = tuple(call.split())
            path = next((words[:n] for n in (2, 1) if words[:n] in known), None)
            if path is None or (path in groups and len(words) > 1):
                unknown.append(" ".join(words))
    return unknown


def unknown_targets_and_schemas(text: str) -> set[str]:
    """Each `make x` target and schemas/ file in the text's code that does not exist."""
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    spans = _code(text)
    named = {t for span in spans for t in re.findall(r"(?:^|\s|\()make ([a-z][a-z-]*)", span)}
    schemas = {s for span in spans for s in re.findall(r"schemas/[A-Za-z0-9._-]+", span)}
    return {f"make {t}" for t in named - targets} | {s for s in schemas if not (ROOT / s).exists()}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_message_version_a_page_names_exists(page: Path) -> None:
    assert unknown_versions(page.read_text()) == set()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_routing_key_a_page_names_is_one_the_runtime_publishes_on(page: Path) -> None:
    assert unknown_routing_keys(page.read_text()) == []


def test_the_subscription_table_names_the_versions_the_runtime_sends_on_its_routing_keys() -> None:
    rows = [line for line in BUS.read_text().splitlines() if line.startswith("| `<tenant>.run.")]
    sent = {row.split("|")[1].strip(" `"): MESSAGE.search(row).groups() for row in rows}  # type: ignore[union-attr]
    assert sent == {event_key("<tenant>", "accepted"): ("run.accepted", str(LATEST["run.accepted"])),
                    event_key("<tenant>", "rejected"): ("run.rejected", str(LATEST["run.rejected"])),
                    status_key("<tenant>", "<STATUS>"): ("run.event", str(LATEST["run.event"])),
                    event_key("<tenant>", "notice.<wait_kind>.<notice>"): ("run.notice", str(LATEST["run.notice"]))}
    statuses = re.findall(r"`([a-z_]+)`", next(r for r in rows if ".run.status." in r).split("|")[3])
    assert sorted(statuses) == sorted(s.value.lower() for s in RunStatus)


def test_each_messages_section_calls_the_latest_version_current() -> None:
    text = BUS.read_text()
    current = dict(re.findall(r"### `(run\.[a-z_]+)`\n\n\*\*v(\d+)\*\* \(current\)", text))
    assert current == {t: str(v) for t, v in LATEST.items() if t != "run.wakeup"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_longrunctl_command_a_page_names_exists(page: Path) -> None:
    assert unknown_commands(page.read_text()) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_make_target_and_schema_file_a_page_names_exists(page: Path) -> None:
    assert unknown_targets_and_schemas(page.read_text()) == set()


MUTANTS = {
    # A page naming a version that was never released, or one beyond the current.
    "a version past the current": (unknown_versions, lambda: f"publish `run.create` v{LATEST['run.create'] + 1}"),
    "a version of a message that does not exist": (unknown_versions, lambda: "`run.finished` v1 says so"),
    # Routing keys a consumer would bind and never hear anything on.
    "an event the runtime never sends": (unknown_routing_keys, lambda: "bind `<tenant>.run.finished`"),
    "a status that does not exist": (unknown_routing_keys, lambda: "```\nacme.run.status.done\n```"),
    "a status in the wrong place": (unknown_routing_keys, lambda: "`acme.run.completed`"),
    "a notice that is not sent": (unknown_routing_keys, lambda: "`acme.run.notice.approval.nagged`"),
    "a longrunctl command that does not exist": (unknown_commands, lambda: "`longrunctl run frobnicate`"),
    "a make target that does not exist": (unknown_targets_and_schemas, lambda: "run `make deploy-everything`"),
    "a schema file that does not exist": (unknown_targets_and_schemas, lambda: "see `schemas/run.create.v99.json`"),
}


@pytest.mark.parametrize("mutant", MUTANTS, ids=str)
def test_a_page_with_one_wrong_name_fails_the_check(mutant: str) -> None:
    # Each real page passes; the bus page with one wrong name added does not.
    check, wrong = MUTANTS[mutant]
    text = BUS.read_text()
    assert not check(text)
    assert check(f"{text}\n{wrong()}\n")
