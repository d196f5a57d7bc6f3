"""A wait for a person may remind its owner and escalate: two more timer kinds, ``wait_reminder`` and
``wait_escalation`` (``domain.reminders``).

The widened CHECK replaces the old one in one transaction; every existing row satisfies it, and the
drop and add each take the table's lock only for as long as the check of its rows.

Revision ID: 0039
Revises: 0037
"""

from __future__ import annotations

from alembic import op

revision = '0039'
down_revision = '0037'
branch_labels = None
depends_on = None

_BEFORE = ('retry_backoff', 'wait_deadline', 'business_deadline', 'schedule_to_start', 'start_to_close',
           'heartbeat', 'sleep')
_AFTER = (*_BEFORE, 'wait_reminder', 'wait_escalation')


def _kinds(kinds: tuple[str, ...]) -> str:
    return "kind IN (" + ", ".join(f"'{k}'" for k in kinds) + ")"


def upgrade() -> None:
    op.drop_constraint(op.f('ck_timers_kind'), 'timers', type_='check')
    op.create_check_constraint(op.f('ck_timers_kind'), 'timers', _kinds(_AFTER))


def downgrade() -> None:
    # Open reminder and escalation timers have no kind the old CHECK knows: their waits stay, unreminded.
    op.execute("DELETE FROM timers WHERE kind IN ('wait_reminder', 'wait_escalation')")
    op.drop_constraint(op.f('ck_timers_kind'), 'timers', type_='check')
    op.create_check_constraint(op.f('ck_timers_kind'), 'timers', _kinds(_BEFORE))
