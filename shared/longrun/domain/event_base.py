"""The base every run event derives from (``longrun.domain.events`` holds the types and their JSON form)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

event = dataclass(frozen=True, slots=True, kw_only=True)
"""How every run event is declared: frozen, slotted, keyword-only."""


@event
class RunEvent:
    type: ClassVar[str]
    seq: int
    at: float
