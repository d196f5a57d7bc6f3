"""What an operator reads before retiring old code: per run kind and pinned versions, the runs
still open by status, the oldest of them waiting, and which live workers advertise those versions
(``service_members.advertised``: a version no live worker serves cannot move on), and how many runs
wait for one."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db import versions as pins


async def report(conn: AsyncConnection) -> list[dict[str, Any]]:
    """One entry per (kind, pins) with open runs or a live worker serving it, oldest version first."""
    entries: dict[tuple[str, ...], dict[str, Any]] = {}
    for row in await pins.in_flight(conn):
        entry = entries.setdefault(tuple(row[:5]), _entry(*row[:5]))
        entry["open_runs"][row.status] = row.runs
        entry["waiting_for_a_worker"] += row.awaiting_worker
        if row.oldest_wait is not None and (entry["oldest_wait"] is None or row.oldest_wait < entry["oldest_wait"]):
            entry["oldest_wait"] = row.oldest_wait
    for member in await pins.live_workers(conn):
        for pin in member.advertised:
            key = (pin["kind"], pin["workflow"], pin["prompt"], pin["model_policy"], pin["tool_schemas"])
            entries.setdefault(key, _entry(*key))["served_by"].append(member.instance_id)
    return [{**e, "oldest_wait": e["oldest_wait"] and e["oldest_wait"].isoformat(),
             "served_by": sorted(e["served_by"])} for _, e in sorted(entries.items())]


def _entry(kind: str, workflow: str, prompt: str, model_policy: str, tool_schemas: str) -> dict[str, Any]:
    return {"kind": kind, "versions": {"workflow": workflow, "prompt": prompt, "model_policy": model_policy,
                                       "tool_schemas": tool_schemas},
            "open_runs": {}, "oldest_wait": None, "waiting_for_a_worker": 0, "served_by": []}
