"""The reads behind the versions report (``longrun.services.gateway.versions``): open runs per run kind, pinned
versions and status, and the versions each live worker advertises."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Row, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db.schema import runs, service_members
from longrun.domain import TERMINAL, WAITING

_PINS = (runs.c.workflow, runs.c.workflow_version, runs.c.prompt_version, runs.c.model_policy_version,
         runs.c.tool_schema_version)
_OPEN = runs.c.status.notin_([s.value for s in TERMINAL])
_IN_FLIGHT = (select(*_PINS, runs.c.status, func.count().label("runs"),
                     func.min(runs.c.updated_at).filter(runs.c.status.in_([s.value for s in WAITING]))
                     .label("oldest_wait"),
                     func.count().filter(runs.c.awaiting_worker.isnot(None)).label("awaiting_worker"))
              .where(_OPEN).group_by(*_PINS, runs.c.status))
_LIVE = select(service_members.c.instance_id, service_members.c.advertised).where(
    service_members.c.service == "worker", service_members.c.alive_until > func.now(),
    service_members.c.stopping.is_(False))  # a stopping worker takes no new runs


async def in_flight(conn: AsyncConnection) -> Sequence[Row]:  # type: ignore[type-arg]
    """Per run kind, its four pinned versions and status: the open runs (``runs``), the oldest
    waiting one's last change (``oldest_wait``) and how many wait for a worker (``awaiting_worker``)."""
    return (await conn.execute(_IN_FLIGHT)).all()


async def live_workers(conn: AsyncConnection) -> Sequence[Row]:  # type: ignore[type-arg]
    """Each live worker's ``instance_id`` and the pins it ``advertised``."""
    return (await conn.execute(_LIVE)).all()
