"""What the memory adapters (``testing.transaction``, ``testing.reconcile_store``) read and write: the
tables of a world in memory and where what they send lands. ``testing.world.World`` keeps them; the
adapters depend on this shape only, never on the world that holds it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from longrun.authoring import Registry
from longrun.db import outbox
from longrun.domain import TenantPolicy
from longrun.envelope import Envelope
from longrun.ports.webhooks import Translated
from longrun.testing.memory import FakeClock, MemoryStore


class Tables(Protocol):
    store: MemoryStore
    clock: FakeClock
    kinds: Registry
    loop: asyncio.AbstractEventLoop
    pending: list[Envelope]
    """Wakeups published, not yet delivered to a worker."""
    broadcasts: list[Envelope]
    """Every other message published."""
    kept: dict[tuple[str, str], tuple[Translated, str | None]]
    """Verified webhook events by (provider, event id), with the run each matched, if any."""
    audit_log: list[dict[str, Any]]
    policies: dict[str, TenantPolicy]
    tenant_slots: dict[str, int]
    """The tenants' own run slots; a tenant without has the platform's."""
    artifacts: dict[str, int]
    """Registered receipts: reference -> size."""

    def send(self, messages: Sequence[outbox.Message]) -> None:
        """What the relay would publish: wakeups to ``pending``, the rest to ``broadcasts``."""

    def admit(self, tenant_id: str) -> None:
        """The scheduler's admission round for the tenant."""
