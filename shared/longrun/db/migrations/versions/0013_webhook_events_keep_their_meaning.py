"""A kept webhook event keeps what its provider made of it (``fact_key``, ``fact``), so the worker
or timer that matches it to a wait later needs no provider: providers are plugged into the gateway
(``longrun.webhook_providers``), not into every service.

Events still waiting to be matched are translated here, by the providers this deployment installs
(the migration runs with the services' configuration); one whose provider is not installed stops the
migration, naming it, rather than lose the event. Matched events are history and stay as they are.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('webhook_events', sa.Column('fact_key', sa.Text(), nullable=True))
    op.add_column('webhook_events', sa.Column('fact', JSONB(), nullable=True))
    conn = op.get_bind()
    waiting = conn.execute(sa.text("SELECT provider, event_id, payload FROM webhook_events "
                                   "WHERE matched_run_id IS NULL")).all()
    if not waiting:
        return
    from longrun import webhook_providers
    from longrun.config import Settings

    providers = webhook_providers.load(Settings.from_env())
    for row in waiting:
        if row.provider not in providers:
            raise RuntimeError(f"webhook event {row.event_id} of provider {row.provider!r} waits to be matched, and "
                               f"no installed provider is called {row.provider!r} (LONGRUN_WEBHOOK_PROVIDERS or a "
                               "longrun.webhook_providers entry point): install it and migrate again")
        event = providers[row.provider].translate(row.payload)
        conn.execute(sa.text("UPDATE webhook_events SET fact_key = :k, fact = CAST(:f AS jsonb) "
                             "WHERE provider = :p AND event_id = :e"),
                     {"k": event.fact_key, "f": json.dumps(event.fact), "p": row.provider, "e": row.event_id})


def downgrade() -> None:
    op.drop_column('webhook_events', 'fact')
    op.drop_column('webhook_events', 'fact_key')
