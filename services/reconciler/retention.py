"""Retention: every table that grows keeps its rows for a horizon, then they go.

``plan`` decides, from the horizons and the database's time, what each rule deletes (rows done
with before its cutoff) and which finished runs are archived; it is pure. ``run_pass`` carries a
plan out in small transactions: a rule's rows in bounded deletes, walking the table by block
ranges (``block_ranges``); finished runs in batches, each batch's events and actions written as
one JSON Lines archive to the artifact store (``archive_lines``), registered, and pruned in the
transaction that marks the runs archived. The run row stays as a tombstone: a repeated
``run.create`` finds it by its key and input hash, and the operator API says where its archive is.
The artifact orphan sweep (``longrun.db.artifacts.sweep_orphans``: uploads on record past the grace
period and never registered) runs with every pass.

Invariants: a run that is not finished is never touched; an archive is stored and registered before
the rows it holds are deleted, in the same transaction as the deletion.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.artifacts import RUNTIME, ArtifactStore
from longrun.db import artifacts
from longrun.db import retention as rows
from longrun.db.audit import audit

logger = logging.getLogger(__name__)

BLOCK_SPAN = 1024
"""Blocks (8 KiB each) one delete statement reads at most: a bounded scan per statement."""
PRODUCER = "reconciler"


@dataclass(frozen=True, slots=True)
class Horizons:
    """Seconds each kind of row is kept once done with, by rule (``db.retention.RULES``), and how
    long a finished run keeps its events and actions."""

    rules: Mapping[str, float]
    finished_runs: float


@dataclass(frozen=True, slots=True)
class Plan:
    cutoffs: Mapping[str, datetime]
    """Per rule: its rows done with before this instant go."""
    archive_before: datetime
    """Finished runs last changed before this instant are archived."""


def plan(horizons: Horizons, now: datetime) -> Plan:
    """What a pass prunes, as of ``now`` (the database's time)."""
    unknown = set(horizons.rules) ^ set(rows.RULES)
    if unknown:
        raise ValueError(f"horizons and retention rules differ: {sorted(unknown)}")
    return Plan({rule: now - timedelta(seconds=seconds) for rule, seconds in horizons.rules.items()},
                now - timedelta(seconds=horizons.finished_runs))


def block_ranges(blocks: int, span: int = BLOCK_SPAN) -> Iterator[tuple[int, int]]:
    """[first, end) block ranges covering a table of ``blocks`` blocks, ``span`` at a time."""
    for first in range(0, blocks, span):
        yield first, min(first + span, blocks)


def archive_lines(records: Sequence[Mapping[str, Any]]) -> bytes:
    """JSON Lines: one record per line (``db.retention.archived_rows``), times in ISO 8601."""
    return b"".join(orjson.dumps(record) + b"\n" for record in records)


@dataclass(slots=True)
class Pruned:
    """What one pass removed: rows per rule, and the runs archived with their events and actions."""

    deleted: dict[str, int] = field(default_factory=dict)
    runs_archived: int = 0
    events: int = 0
    actions: int = 0
    archives: list[str] = field(default_factory=list)
    orphans: int = 0

    def summary(self) -> dict[str, Any]:
        return {"deleted": {k: v for k, v in self.deleted.items() if v}, "runs_archived": self.runs_archived,
                "events": self.events, "actions": self.actions, "archives": self.archives,
                "orphan_artifacts": self.orphans}

    @property
    def anything(self) -> bool:
        return bool(any(self.deleted.values()) or self.runs_archived or self.orphans)


async def run_pass(engine: AsyncEngine, store: ArtifactStore, horizons: Horizons, *, batch: int, archive_batch: int,
                   orphan_grace: float) -> Pruned:
    """One retention pass; logs and audits what it pruned (when anything)."""
    async with engine.connect() as conn:
        now = await rows.database_now(conn)
    chosen = plan(horizons, now)
    pruned = Pruned()
    await _archive(engine, store, chosen.archive_before, archive_batch, pruned)
    for rule, before in chosen.cutoffs.items():
        pruned.deleted[rule] = await _delete(engine, rule, before, batch)
    pruned.orphans = len(await artifacts.sweep_orphans(engine, store, grace_seconds=orphan_grace))
    if pruned.anything:
        logger.info("retention pass as of %s: %s", now.isoformat(), pruned.summary())
        async with engine.begin() as conn:
            await audit(conn, actor=PRODUCER, action="retention.pass", target=now.isoformat(),
                        reason="horizons reached", details=pruned.summary())
    return pruned


async def _delete(engine: AsyncEngine, rule: str, before: datetime, batch: int) -> int:
    async with engine.connect() as conn:
        blocks = await rows.blocks(conn, rows.RULES[rule].table)
    deleted = 0
    for first, end in block_ranges(blocks):
        while True:
            async with engine.begin() as conn:
                n = await rows.delete_done(conn, rule, before=before, first_block=first, end_block=end, limit=batch)
            deleted += n
            if n < batch:
                break
    return deleted


async def _archive(engine: AsyncEngine, store: ArtifactStore, before: datetime, limit: int, pruned: Pruned) -> None:
    after: tuple[datetime, str] | None = None
    while True:
        async with engine.begin() as conn:
            found = await rows.finished_runs(conn, before=before, after=after, limit=limit)
            if found.run_ids:
                data = archive_lines(await rows.archived_rows(conn, found.run_ids))
                # Stored before the transaction that deletes what it holds commits (upload, then register).
                archive = await store.put(RUNTIME, data)
                await artifacts.register(conn, store, archive, tenant_id=RUNTIME, size=len(data),
                                         media_type=rows.ARCHIVE_MEDIA_TYPE, run_id=None)
                events, actions = await rows.prune_archived(conn, found.run_ids, archive)
                pruned.runs_archived += len(found.run_ids)
                pruned.events += events
                pruned.actions += actions
                pruned.archives.append(archive)
        if found.after is None:
            return
        after = found.after
