"""The Dockerfile read as data: its stages, each stage's instructions, and each RUN's mounts and commands,
so tests check it, and replay its install steps, without a Docker engine."""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "Dockerfile"


@dataclass(frozen=True)
class Mount:
    """A ``RUN --mount=type=bind``: ``source`` from the build context, or from stage ``stage``."""

    target: str
    source: str
    stage: str | None


@dataclass(frozen=True)
class Run:
    mounts: tuple[Mount, ...]
    commands: tuple[tuple[str, ...], ...]
    """The shell commands joined by ``&&``, each split as the shell would."""


@dataclass(frozen=True)
class Stage:
    name: str
    base: str
    steps: tuple[tuple[str, str], ...]
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""

    def args(self, instruction: str) -> list[str]:
        return [args for op, args in self.steps if op == instruction]

    def copies(self) -> list[tuple[list[str], str]]:
        """(sources, destination) of each COPY from the build context."""
        found = []
        for args in self.args("COPY"):
            words = args.split()
            assert not any(w.startswith("--") for w in words), f"COPY with flags: {args}"
            found.append((words[:-1], words[-1]))
        return found

    def runs(self) -> list[Run]:
        return [parse_run(args) for args in self.args("RUN")]


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile's text."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
            for line in joined.splitlines() if line.strip()]


@functools.cache
def stages() -> dict[str, Stage]:
    """Every stage of the Dockerfile by name, in order."""
    found: dict[str, Stage] = {}
    name, base, steps = "", "", []
    for op, args in instructions(DOCKERFILE.read_text()):
        if op == "FROM":
            if name:
                found[name] = Stage(name, base, tuple(steps))
            words = args.split()
            assert len(words) == 3 and words[1].upper() == "AS", f"every stage is named: FROM {args}"
            base, name, steps = words[0], words[2], []
        else:
            steps.append((op, args))
    found[name] = Stage(name, base, tuple(steps))
    return found


def parse_run(args: str) -> Run:
    words = shlex.split(args)
    mounts = []
    while words and words[0].startswith("--mount="):
        options = dict(part.split("=", 1) for part in words.pop(0).removeprefix("--mount=").split(","))
        assert options.pop("type") == "bind", options
        mounts.append(Mount(options["target"], options["source"], options.get("from")))
    commands, current = [], []
    for word in words:
        if word == "&&":
            commands.append(tuple(current))
            current = []
        else:
            current.append(word)
    commands.append(tuple(current))
    return Run(tuple(mounts), tuple(commands))
