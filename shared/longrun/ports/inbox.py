"""The values of a service's inbox (one row per handled message): a message as claimed, a first
claim, a repeat with the outcome recorded for the first, a message handled with its change in
one statement, and what a consumer's handler made of a message (``Outcome``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from longrun.envelope import Envelope


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


@dataclass(frozen=True, slots=True)
class Outcome:
    envelope: Envelope
    outcome: dict[str, Any]
    duplicate: bool
    carried: object = None
    """What an ``OwnClaim`` handler hands to the after-ack hook with the outcome (the worker: the
    run's lease, with the run as taken): the hook runs after the ack, in the same task."""
