"""The values of a service's inbox (one row per handled message): a message as claimed, a first
claim, a repeat with the outcome recorded for the first, and a message handled with its change in
one statement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Message:
    message_id: str
    message_type: str
    run_id: str | None


@dataclass(frozen=True, slots=True)
class Claimed:
    message_id: str


@dataclass(frozen=True, slots=True)
class Duplicate:
    message_id: str
    outcome: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Handled:
    outcome: dict[str, Any]
    duplicate: bool
    row: Any
    """The statement's row: what its change returned (nulls for a duplicate)."""
