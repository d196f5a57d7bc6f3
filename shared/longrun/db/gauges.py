"""The database gauges' reads (``longrun.services.reconciler.gauges`` decides who collects them, and when):
aggregates over runs, actions, the outbox, the quarantine and failing cleanups, in the caller's transaction."""

from __future__ import annotations

import time
from collections.abc import Mapping

from sqlalchemy import Float, func, literal, select
from sqlalchemy.ext.asyncio import AsyncConnection

from longrun.db.alerts import silent
from longrun.db.schema import actions, cleanups, outbox, quarantine, rate_limit_buckets, runs
from longrun.domain import AWAITING_RECONCILER, RunStatus
from longrun.domain.rate_limit import RATE_LIMIT_PREFIX, RATE_LIMIT_WAIT
from longrun.metrics import Figures

def _age(column: object) -> object:
    return func.coalesce(func.extract("epoch", func.now() - func.min(column)), 0).cast(Float)


async def read(conn: AsyncConnection, *, silence_limits: Mapping[RunStatus, float], tenants: bool) -> Figures:
    """Every database gauge, read on ``conn`` (inside the caller's transaction)."""
    started = time.perf_counter()
    tenant = runs.c.tenant_id if tenants else literal("")
    by_status = await conn.execute(select(runs.c.workflow, runs.c.status, tenant, func.count())
                                   .group_by(runs.c.workflow, runs.c.status, tenant))
    by_action = await conn.execute(select(actions.c.status, func.count()).group_by(actions.c.status))
    oldest_doubt = (await conn.execute(select(_age(actions.c.updated_at))
                                       .where(actions.c.status.in_(sorted(s.value for s in AWAITING_RECONCILER))))).scalar_one()
    backlog = (await conn.execute(select(func.count(), _age(outbox.c.created_at))
                                  .where(outbox.c.published_at.is_(None)))).one()
    kept = await conn.execute(select(quarantine.c.owner, quarantine.c.error_code, func.count())
                              .where(quarantine.c.replayed_at.is_(None))
                              .group_by(quarantine.c.owner, quarantine.c.error_code))
    # Every limited status is exported, 0 when none is silent: a panel or alert sees the series.
    quiet = {status.value: 0 for status in silence_limits}
    if silence_limits:
        quiet.update({s: n for s, n in await conn.execute(
            select(runs.c.status, func.count()).where(silent(silence_limits)).group_by(runs.c.status))})
    waiting = await conn.execute(select(runs.c.workflow, func.count()).where(runs.c.awaiting_worker.isnot(None))
                                 .group_by(runs.c.workflow))
    held = await conn.execute(select(runs.c.wait_correlation_key, func.count(), _age(runs.c.updated_at))
                              .where(runs.c.wait_kind == RATE_LIMIT_WAIT).group_by(runs.c.wait_correlation_key))
    b = rate_limit_buckets.c
    levels = await conn.execute(select(b.bucket, func.least(b.burst, b.level + b.rate * func.greatest(
        0, func.extract("epoch", func.now() - b.at))).cast(Float)))
    failing = await conn.execute(select(runs.c.workflow, func.count())
                                 .select_from(cleanups.join(runs, cleanups.c.run_id == runs.c.run_id))
                                 .where(cleanups.c.done_at.is_(None), cleanups.c.alerted).group_by(runs.c.workflow))
    return Figures(
        runs={(w, s, t): n for w, s, t, n in by_status}, actions={s: n for s, n in by_action},
        in_doubt_oldest=float(oldest_doubt), outbox_backlog=backlog[0], outbox_oldest=float(backlog[1]),
        quarantine={(o, r): n for o, r, n in kept}, silent=quiet, awaiting_worker={w: n for w, n in waiting},
        rate_limit_held={key.removeprefix(RATE_LIMIT_PREFIX): (n, float(age)) for key, n, age in held},
        rate_limit_levels={bucket: float(level) for bucket, level in levels},
        cleanups_failing={w: n for w, n in failing},
        took=time.perf_counter() - started)
