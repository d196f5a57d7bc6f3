"""Admission's choice, written once: a tenant's best queued runs, by priority plus one point per
``aging`` seconds waited, then age; rows another admitter holds are skipped, not waited for."""

from __future__ import annotations

from sqlalchemy import text

from longrun.db.schema import OPEN_RUN

ADMITTED_OPEN = f"tenant_id = {{tenant}} AND admitted_at IS NOT NULL AND {OPEN_RUN}"
"""A tenant's admitted runs that hold a slot (read through ix_runs_open_by_tenant)."""
TENANT_SLOTS = ("SELECT count(*) FILTER (WHERE admitted_at IS NOT NULL) AS active, "
                "count(*) FILTER (WHERE admitted_at IS NULL AND status = 'READY') AS waiting "
                f"FROM runs WHERE tenant_id = {{tenant}} AND {OPEN_RUN}")
"""A tenant's runs holding a slot, and those queued for one (read through ix_runs_open_by_tenant)."""
SCORE = "priority + extract(epoch FROM now() - created_at) / {aging}"


def best_queued(*, tenant: str, aging: str, limit: str) -> str:
    """The SELECT of the best queued run ids (``tenant``, ``aging``, ``limit`` are SQL expressions)."""
    return (f"SELECT run_id FROM runs WHERE tenant_id = {tenant} AND admitted_at IS NULL AND status = 'READY' "
            f"ORDER BY {SCORE.format(aging=aging)} DESC, created_at LIMIT {limit} FOR UPDATE SKIP LOCKED")


# The best queued runs of a tenant, admitted in the statement that picks them.
ADMIT_BEST = text(
    f"UPDATE runs SET admitted_at = now() WHERE run_id IN ({best_queued(tenant=':t', aging=':aging', limit=':n')}) "
    f"RETURNING run_id, tenant_id, partition, revision, created_at, {SCORE.format(aging=':aging')} AS score")
