"""A kept webhook event keeps what its provider made of it (``fact_key``, ``fact``), so the worker
or timer that matches it to a wait later needs no provider: providers are plugged into the gateway
(``longrun.webhook_providers``), not into every service.

Events still waiting to be matched are translated here. Releases before this one accepted the
``forge`` provider's events only, so the migration holds that translation as it was then (a
migration imports no runtime code: providers change, this revision must not); an event of any other
provider stops the migration, naming it, rather than lose the event. Matched events are history and
stay as they are.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def _forge_fact(payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """What the forge provider made of an event (its fact key and fact) when this revision was
    written; the gateway refused every other event type."""
    if payload.get("type") == "branch.pushed":
        return f"head:{payload['branch']}", {"sha": payload["sha"], "pusher": payload.get("pusher", "")}
    return (f"ci_result:{payload['ci_run_id']}",
            {"status": payload["status"], "sha": payload["sha"], "log_excerpt": payload.get("log_excerpt", "")})


def upgrade() -> None:
    op.add_column('webhook_events', sa.Column('fact_key', sa.Text(), nullable=True))
    op.add_column('webhook_events', sa.Column('fact', JSONB(), nullable=True))
    conn = op.get_bind()
    waiting = conn.execute(sa.text("SELECT provider, event_id, payload FROM webhook_events "
                                   "WHERE matched_run_id IS NULL")).all()
    for row in waiting:
        if row.provider != "forge":
            raise RuntimeError(f"webhook event {row.event_id} of provider {row.provider!r} waits to be matched, and "
                               "this migration knows only the forge provider's events, the only ones accepted "
                               "before it: match or delete the event and migrate again")
        fact_key, fact = _forge_fact(row.payload)
        conn.execute(sa.text("UPDATE webhook_events SET fact_key = :k, fact = CAST(:f AS jsonb) "
                             "WHERE provider = :p AND event_id = :e"),
                     {"k": fact_key, "f": json.dumps(fact), "p": row.provider, "e": row.event_id})


def downgrade() -> None:
    op.drop_column('webhook_events', 'fact')
    op.drop_column('webhook_events', 'fact_key')
