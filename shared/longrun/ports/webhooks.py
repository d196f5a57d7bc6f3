"""What a webhook provider's event means to longrun, as the use cases and the stores exchange it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Translated:
    """What a provider's event means to longrun: which wait it answers and the fact it proves."""

    event_id: str
    correlation_key: str
    fact_key: str
    fact: dict[str, Any]
