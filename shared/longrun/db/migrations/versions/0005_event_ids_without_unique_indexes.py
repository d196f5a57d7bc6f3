"""Event ids without unique indexes of their own: every event and every outbox row paid a btree
insert (an outbox row two: its mark is not a HOT update) for a guarantee another key already gives.

A run event's id is ``run_id:seq``, unique because (run_id, seq) is the primary key: a CHECK now
holds the form, so the id cannot drift from the key. An outbox row's ``event_id`` is its
envelope's fresh UUID; rows are identified by ``id`` and consumers deduplicate by event id.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_constraint('uq_run_events_event_id', 'run_events', type_='unique')
    op.create_check_constraint(op.f('ck_run_events_event_id_is_run_seq'), 'run_events',
                               "event_id = run_id || ':' || seq")
    op.drop_constraint('uq_outbox_event_id', 'outbox', type_='unique')


def downgrade() -> None:
    op.create_unique_constraint(op.f('uq_outbox_event_id'), 'outbox', ['event_id'])
    op.drop_constraint(op.f('ck_run_events_event_id_is_run_seq'), 'run_events', type_='check')
    op.create_unique_constraint(op.f('uq_run_events_event_id'), 'run_events', ['event_id'])
