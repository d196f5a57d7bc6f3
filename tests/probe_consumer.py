"""A consumer replica for bus tests: the library's partitioned consumer with a probe handler.

The handler records each message it applies in ``probe_handled`` by its label, the wakeup's reason (created by the
tests) inside the consumer's transaction, so the table shows exactly what was applied,
by whom and in which order.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun import service
from longrun.bootstrap import consume_partitions
from longrun.config import Settings
from longrun.envelope import Envelope

PROBE_TABLE = """
CREATE TABLE IF NOT EXISTS probe_handled (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id text NOT NULL,
    wakeup_id text NOT NULL,
    consumer text NOT NULL,
    handled_at timestamptz NOT NULL DEFAULT clock_timestamp()
)"""


def make_handler(instance_id: str):  # type: ignore[no-untyped-def]
    async def handle(conn: AsyncConnection, envelope: Envelope) -> dict[str, object]:
        await conn.execute(
            text("INSERT INTO probe_handled (run_id, wakeup_id, consumer) VALUES (:r, :w, :c)"),
            {"r": envelope.run_id, "w": envelope.payload.reason, "c": instance_id})
        return {"applied_by": instance_id, "wakeup_id": envelope.payload.reason}

    return handle


async def serve(settings: Settings, stopping: asyncio.Event, health: service.Health) -> None:
    await consume_partitions(settings, service="worker", handler=make_handler(settings.instance_id),
                             stopping=stopping, health=health)


if __name__ == "__main__":
    service.run("probe-consumer", serve)
