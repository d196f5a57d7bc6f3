"""Correlation keys are scoped by webhook provider, and a body-only signature cannot be replayed.

A wait now names the provider whose event ends it (the snapshot's ``wait.provider``), and an event
matches only a wait of its provider. Runs waiting today named none; each is given the provider it
could only have meant: the one whose events were kept under its key, else the one provider that has
ever delivered an event here. When neither tells (several providers, or none yet), the migration
stops naming the runs, unless ``LONGRUN_MIGRATE_WAIT_PROVIDER`` names the provider to give them.
The provider is written into the stored snapshot whatever its schema version (the upcasters keep a
wait's fields), and schema 8 reads it. A wait the runtime ends itself (``tool-healthy:`` keys) gets none.

``webhook_deliveries`` keeps the id of every delivery of a provider that signs the body alone for as
long as its signatures are accepted: the gateway inbox forgets after ``LONGRUN_RETAIN_INBOX``, and a
captured delivery sent again after that is still recognised. Filled here with every id known.

Revision ID: 0030
Revises: 0029
"""

from __future__ import annotations

import os

import sqlalchemy as sa
from alembic import op

revision = '0030'
down_revision = '0029'
branch_labels = None
depends_on = None

_WAITING = ("snapshot->'wait'->>'correlation_key' IS NOT NULL AND (snapshot->'wait'->>'provider') IS NULL "
            "AND snapshot->'wait'->>'correlation_key' NOT LIKE 'tool-healthy:%' "
            "AND status IN ('WAITING_EVENT', 'WAITING_USER', 'PAUSED')")


def upgrade() -> None:
    op.create_table('webhook_deliveries',
                    sa.Column('provider', sa.Text(), nullable=False),
                    sa.Column('event_id', sa.Text(), nullable=False),
                    sa.Column('received_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                              nullable=False),
                    sa.PrimaryKeyConstraint('provider', 'event_id', name=op.f('pk_webhook_deliveries')))
    op.execute("INSERT INTO webhook_deliveries (provider, event_id, received_at) "
               "SELECT provider, event_id, received_at FROM webhook_events ON CONFLICT DO NOTHING")
    conn = op.get_bind()
    # The provider of the events kept under the run's key, when they name one alone.
    conn.execute(sa.text(
        "UPDATE runs SET snapshot = jsonb_set(snapshot, '{wait,provider}', to_jsonb(k.provider)) "
        "FROM (SELECT correlation_key, min(provider) AS provider FROM webhook_events GROUP BY correlation_key "
        "HAVING count(DISTINCT provider) = 1) k "
        f"WHERE k.correlation_key = runs.snapshot->'wait'->>'correlation_key' AND {_WAITING}"))
    left = conn.execute(sa.text(f"SELECT run_id FROM runs WHERE {_WAITING} ORDER BY run_id")).scalars().all()
    if not left:
        return
    seen = conn.execute(sa.text("SELECT DISTINCT provider FROM webhook_events ORDER BY provider")).scalars().all()
    given = os.environ.get("LONGRUN_MIGRATE_WAIT_PROVIDER", "").strip()
    provider = given or (seen[0] if len(seen) == 1 else None)
    if provider is None:
        shown = ", ".join(left[:20]) + (f" and {len(left) - 20} more" if len(left) > 20 else "")
        raise RuntimeError(
            f"{len(left)} waiting run(s) wait on a correlation key no kept event tells the provider of, and "
            f"{'providers ' + ', '.join(seen) + ' have' if seen else 'no provider has'} delivered events here: "
            f"set LONGRUN_MIGRATE_WAIT_PROVIDER to the webhook provider whose events end their waits "
            f"and migrate again (runs: {shown})")
    conn.execute(sa.text("UPDATE runs SET snapshot = jsonb_set(snapshot, '{wait,provider}', "
                         f"to_jsonb(CAST(:p AS text))) WHERE {_WAITING}"), {"p": provider})


def downgrade() -> None:
    op.execute("UPDATE runs SET snapshot = snapshot #- '{wait,provider}' WHERE snapshot ? 'wait' "
               "AND (snapshot->>'schema_version')::int < 8")
    op.drop_table('webhook_deliveries')
